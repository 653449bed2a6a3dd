"""``mediagen generate``: one image or video from a preset (random weights) or a saved folder.

    mediagen generate --class-label 3 --steps 20 --out digit.png      (the default shipped digit model)
    mediagen generate --task text-to-video --prompt "the digit 7 moves left" --out clip.mp4   (the default video model)
    mediagen generate --model ckpt/ --task text-to-image --prompt "a seven" --out seven.png
    mediagen generate --device cuda --runtime cuda-graphs --class-label 3 --out digit.png   (compiled loop)

Prints the path of every file written.

Shipped checkpoints are used as trained (``catalog`` resolves them): with a shipped model (the default for
the task, the one whose card.json names it, or ``--model video-sdpa``), ``--attention`` picks the shipped
checkpoint of the same family trained with that attention, and an attention without one is refused (an
untrained conversion of a trained model gives blank outputs).
Presets and your own folders may be converted to any attention (``--attention``); a note on stderr
says the result is untrained.

A model trained on one caption template (its pipeline's ``caption_template``, as its card says) gets the prompt
rewritten to it by default ("watch the digit three travel left" -> "the digit 3 moves left";
``prompts.rewrite_prompt``); stderr says how the prompt was read. ``--no-rewrite-prompt`` keeps it as written.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

from ..models.attention_spec import attention_choices, uses_blocks
from .names import FLOW_SCHEDULERS, RUNTIMES, SCHEDULERS, START_STEPS

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
TASKS = ("class-to-image", "text-to-image", "text-to-video")
MAX_SEED = 2**31 - 1   # seeds here and in the app
DEFAULT_SHIFT = 3.0    # the time shift of a scheduler made here (presets, transformer folders, --scheduler)


def sampling_dtype(name: str | None, device) -> torch.dtype:
    """--dtype NAME (a DTYPES key), else the default: bf16 on cuda, fp32 elsewhere."""
    if name:
        return DTYPES[name]
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def _ints(text: str) -> list[int]:
    try:
        ints = [int(x) for x in text.replace("x", ",").split(",") if x]
    except ValueError:
        ints = []
    if not ints or min(ints) < 1:
        raise ValueError(f"--blocks {text!r} is not allowed: give ints >= 1 such as 4,4 or 3,5,8")
    return ints


CLASS_STEPS = 20   # class-to-image: a quality default (FID is measured at 30, docs/RESULTS.md)


def register(sub):
    p = sub.add_parser("generate", help="generate an image or a video (PNG / MP4 / GIF) and print its path")
    p.add_argument("--model", default=None,
                   help="a shipped checkpoint (a folder name in mediagen/checkpoints, e.g. image-mhla or video-sdpa), "
                        "a preset name (random weights) or a saved folder (default: the shipped checkpoint whose "
                        "card.json names the task in default_for; the dit-mnist / wan-mmnist preset when none does)")
    p.add_argument("--task", choices=TASKS, default=None, help="default: what the model is for")
    p.add_argument("--prompt", default=None, help="text prompt (text-to-image / text-to-video)")
    p.add_argument("--negative-prompt", default=None)
    p.add_argument("--rewrite-prompt", action=argparse.BooleanOptionalAction, default=None,
                   help="render the prompt in the caption template the model was trained on ('the digit 3 moves "
                        "left'), which it reads far more reliably than other wordings (default: on for a model "
                        "whose card declares a caption_template, off otherwise; stderr says how it was read)")
    p.add_argument("--class-label", type=int, action="append", default=None,
                   help="class index (class-to-image); repeat for several images")
    p.add_argument("--seed", type=int, default=0, help=f"0 to {MAX_SEED}, as in the app (default: %(default)s)")
    p.add_argument("--steps", type=int, default=None,
                   help=f"denoising steps (default: {START_STEPS['text-to-video']} for text-to-video and "
                        f"{START_STEPS['text-to-image']} for text-to-image, as the app starts and where the shipped "
                        f"models' rates are measured; {CLASS_STEPS} for class-to-image)")
    p.add_argument("--guidance", type=float, default=4.0,
                   help="classifier-free guidance scale, >= 0; 1 or less: no guidance (default: %(default)s)")
    p.add_argument("--height", type=int, default=None)
    p.add_argument("--width", type=int, default=None)
    p.add_argument("--frames", type=int, default=None,
                   help="video frames; for text-to-image with a clip model, the clip a still is the middle frame of "
                        "(default: its trained length; 1: a one-frame grid)")
    p.add_argument("--attention", choices=attention_choices(), default=None,
                   help="with a shipped model: use its family's checkpoint trained with this attention (refused "
                        "when none is shipped); with a preset or folder: convert the self-attention first (default: "
                        "as saved; presets: sdpa); a model saved with this attention is used as saved")
    p.add_argument("--blocks", default=None,
                   help="MHLA blocks per grid axis for a conversion (with --attention mhla or wan-mhla-h), e.g. 4,4 "
                        "or 3,5,8 (default: auto)")
    p.add_argument("--scheduler", choices=SCHEDULERS, default=None, help="default: flow-euler (or as saved)")
    p.add_argument("--shift", type=float, default=None,
                   help=f"flow-matching time shift (> 0) of the scheduler made for a preset or a transformer folder, "
                        f"or asked with --scheduler flow-euler / flow-unipc (default: {DEFAULT_SHIFT}); a saved "
                        f"pipeline (a shipped checkpoint) keeps its saved scheduler and shift unless --scheduler "
                        f"is given")
    p.add_argument("--out", default=None, help="output file (.png, .mp4 or .gif); default outputs/<task>-<seed>.*")
    p.add_argument("--fps", type=int, default=8, help="frames per second of a video, >= 1 (default: %(default)s)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="cpu, cuda or cuda:N (default: %(default)s)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default: bf16 on cuda, fp32 on cpu")
    p.add_argument("--runtime", choices=RUNTIMES, default="eager",
                   help="how the denoising loop runs the transformer: eager, compile (torch.compile; the first "
                        "step compiles) or cuda-graphs (torch.compile with CUDA graphs, --device cuda only); "
                        "outputs match eager within the dtype's rounding (default: eager)")
    p.set_defaults(func=run)


def _default_model(task: str | None) -> str:
    """The shipped default for the task (no task: class-to-image), the checkpoint whose card names it, else the
    family's preset with random weights."""
    from .catalog import default_checkpoint, family_for_task

    task = task or TASKS[0]
    return default_checkpoint(task) or family_for_task(task).preset


def _shipped_with(model: str, attention: str) -> str:
    """The shipped checkpoint of ``model``'s family trained with ``attention``; refused when none is."""
    from .catalog import family_of, label_of, trained_attentions
    from .shipping import checkpoints_dir

    family = family_of(model)
    trained = trained_attentions(family)
    if attention not in trained:
        raise ValueError(f"--attention {attention} is not allowed with the shipped {family} models: trained "
                         f"checkpoints exist for {', '.join(trained)} ({checkpoints_dir()}/{family}-<attention>/); "
                         f"an untrained conversion is not offered (convert a preset or your own --model folder)")
    return f"{family}-{label_of(attention)}"


def _converted_as(transformer, attention: str) -> bool:
    """Whether the model's self-attention layers already are ``attention`` (a saved converted model)."""
    from ..models.attention_spec import layer_attentions
    from ..models.convert import attention_spec_of

    spec = attention_spec_of(transformer)
    return spec is not None and layer_attentions(attention, len(spec.layers)) == spec.layers


def _sizes(args, pipe, model_preset):
    from .text_video import TextToVideoPipeline

    def asked(value, default):
        return default if value is None else value

    if not isinstance(pipe, TextToVideoPipeline):
        side = pipe.default_size()
        return asked(args.height, side), asked(args.width, side), None
    height = asked(args.height, (model_preset or {}).get("height", 64))
    width = asked(args.width, (model_preset or {}).get("width", 64))
    frames = asked(args.frames, (model_preset or {}).get("frames", 16))
    return height, width, frames


def _device(name: str) -> torch.device:
    """--device NAME as a torch device; refused (one line) unless cpu, an available cuda (cuda:N below the GPU
    count) or an available mps."""
    allowed = "use cpu, cuda or cuda:N"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"--device {name!r} is not allowed: {allowed}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device {name} was asked for but no CUDA GPU is visible; use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"--device {name} is not allowed: {torch.cuda.device_count()} CUDA GPU(s) are visible "
                             f"(cuda:0 to cuda:{torch.cuda.device_count() - 1})")
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError(f"--device {name} is not allowed: MPS is not available here; {allowed}")
    elif device.type != "cpu":
        raise ValueError(f"--device {name!r} is not allowed: {allowed}")
    return device


def _check_numbers(args) -> None:
    """The numeric options, refused (one line naming the flag) before any model is built."""
    if not 0 <= args.seed <= MAX_SEED:
        raise ValueError(f"--seed {args.seed} is not allowed: use an int from 0 to {MAX_SEED}")
    if not (math.isfinite(args.guidance) and args.guidance >= 0):
        raise ValueError(f"--guidance {args.guidance:g} is not allowed: use a number >= 0 (1 or less: no guidance)")
    if args.shift is not None and not (math.isfinite(args.shift) and args.shift > 0):
        raise ValueError(f"--shift {args.shift:g} is not allowed: use a number > 0")
    for flag, value in (("--fps", args.fps), ("--steps", args.steps), ("--height", args.height),
                        ("--width", args.width), ("--frames", args.frames)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} {value} is not allowed: use an int >= 1")


def _saved_pipeline(model: str) -> bool:
    """Whether ``model`` loads as a saved pipeline with its own scheduler (as ``build_pipeline`` resolves it)."""
    from ..models.presets import PRESETS
    from .shipping import shipped_checkpoint

    if model in PRESETS:
        return False
    path = Path(model)
    if not path.exists():
        path = shipped_checkpoint(model) or path
    return (path / "model_index.json").is_file()


def _check_shift(args) -> None:
    """A given --shift takes effect, or is refused saying why."""
    if args.shift is None:
        return
    if args.scheduler is not None and args.scheduler not in FLOW_SCHEDULERS:
        raise ValueError(f"--shift is not allowed with --scheduler {args.scheduler}: only the flow schedulers "
                         f"({', '.join(FLOW_SCHEDULERS)}) have a time shift")
    if args.scheduler is None and _saved_pipeline(args.model):
        raise ValueError(f"--shift {args.shift:g} has no effect on {args.model}: a saved pipeline samples with its "
                         f"saved scheduler and shift; give --scheduler {' or '.join(FLOW_SCHEDULERS)} with it")


_INTERNAL = {"height": "--height", "width": "--width", "num_frames": "--frames", "num_inference_steps": "--steps"}
_INTERNAL_RE = re.compile(r"(?<![\w-])(" + "|".join(_INTERNAL) + r")=")


@contextmanager
def _flags_named():
    """The pipelines' checks name their arguments ("height=9 is not allowed"); say the flags instead."""
    try:
        yield
    except ValueError as err:
        raise ValueError(_INTERNAL_RE.sub(lambda m: _INTERNAL[m[1]] + " ", str(err))) from err


def _check_out(out: Path, task: str | None) -> None:
    """``out``'s suffix against what ``task`` writes (None: any task, the model not known yet)."""
    from .export import IMAGE_FORMATS, VIDEO_FORMATS

    allowed = {"text-to-video": VIDEO_FORMATS, None: (*IMAGE_FORMATS, *VIDEO_FORMATS)}.get(task, IMAGE_FORMATS)
    if out.suffix.lstrip(".").lower() not in allowed:
        what = "mediagen generate" if task is None else task
        raise ValueError(f"--out {str(out)!r}: {what} writes {' or '.join(allowed)} files")


def run(args) -> int:
    from ..models.convert import convert
    from ..models.presets import PRESETS
    from .building import build_pipeline, task_of, token_grid
    from .catalog import card_size, checkpoints, family_of, read_card
    from .export import save_media
    from .prompts import prompt_note, size_note

    device = _device(args.device)
    _check_numbers(args)
    dtype = sampling_dtype(args.dtype, device)
    if args.runtime == "cuda-graphs" and device.type != "cuda":   # refused before any model is built
        raise ValueError(f"--runtime cuda-graphs is not allowed with --device {args.device}: CUDA graphs need "
                         f"--device cuda; use --runtime compile or eager")
    if args.out is not None:  # refused before any model is built where the suffix already tells
        _check_out(Path(args.out), args.task)
    if args.blocks is not None:   # checked before any model is built
        if args.attention is None:
            raise ValueError(f"--blocks {args.blocks!r} is not allowed without --attention: --blocks is for "
                             f"conversions; use it with --attention")
        if not uses_blocks(args.attention):
            with_blocks = " or ".join(a for a in attention_choices() if uses_blocks(a))
            raise ValueError(f"--blocks is not allowed with --attention {args.attention}: it has no blocks; use "
                             f"--blocks with --attention {with_blocks}")
        _ints(args.blocks)
    if args.model is None:
        args.model = _default_model(args.task)
    _check_shift(args)
    if family_of(args.model) and args.attention is not None:
        if args.blocks:
            raise ValueError(f"--blocks {args.blocks!r} is not allowed with a shipped checkpoint ({args.model}): it "
                             f"runs with its trained blocks (fitted to smaller grids); --blocks is for conversions")
        args.model, args.attention = _shipped_with(args.model, args.attention), None
    shift = DEFAULT_SHIFT if args.shift is None else args.shift
    pipe = build_pipeline(args.model, task=args.task, scheduler=args.scheduler, shift=shift, seed=args.seed,
                          device=device, dtype=dtype)
    task = args.task or task_of(pipe.transformer)
    if (task == "class-to-image") != (task_of(pipe.transformer) == "class-to-image"):
        raise ValueError(f"--task {task} does not fit model {args.model!r} (a {task_of(pipe.transformer)} model)")
    suffix = ".mp4" if task == "text-to-video" else ".png"
    out = Path(args.out) if args.out else Path("outputs") / f"{task}-{args.seed}{suffix}"
    _check_out(out, task)
    preset = PRESETS.get(args.model)
    # a shipped checkpoint draws at its card's size when none is asked (a long-clip model at its long clips)
    shipped = family_of(args.model)
    card = read_card(checkpoints(shipped)[args.model.partition("-")[2]]) if shipped else {}
    size = card_size(card) if shipped else None
    height, width, frames = _sizes(args, pipe, size or preset)
    if task == "text-to-image":
        # a still from a clip model is the middle frame of a clip of its trained length (--frames 1: a
        # one-frame grid); a model trained on images draws one frame
        frames = args.frames if args.frames is not None else (
            frames if family_of(args.model) == "video" or preset is not None else 1)
    if args.attention is None and preset is not None:
        args.attention = "sdpa"
    if args.attention is not None and not args.blocks and _converted_as(pipe.transformer, args.attention):
        args.attention = None  # already so: converting again would replace its trained Mc and options
    if args.attention is not None:
        from ..models.convert import attention_spec_of

        with _flags_named():
            grid = token_grid(pipe, height, width, frames)
        blocks = _ints(args.blocks) if args.blocks else None
        # a model saved with another attention is replaced on purpose here: --attention asked for it
        again = {"reinit": True} if attention_spec_of(pipe.transformer) is not None else {}
        convert(pipe, args.attention, blocks=blocks, grid=grid, **again)
        pipe.to(device)
        if args.attention != "sdpa" or again:
            print(f"note: {args.model} runs with {args.attention} attention converted without training: its "
                  f"outputs are untrained", file=sys.stderr)
    pipe.set_runtime(args.runtime)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    steps = args.steps if args.steps is not None else START_STEPS.get(task, CLASS_STEPS)
    common = dict(num_inference_steps=steps, guidance_scale=args.guidance, height=height, width=width,
                  generator=generator, output_type="np")
    if task == "class-to-image":
        if args.prompt is not None:
            raise ValueError("--prompt is for text models; this one takes --class-label")
        if args.rewrite_prompt is not None:
            raise ValueError("--rewrite-prompt / --no-rewrite-prompt is for text models; this one takes --class-label")
        with _flags_named():
            result = pipe(class_labels=args.class_label or [0], **common).images
    else:
        if args.class_label is not None:
            raise ValueError("--class-label is for class-conditional models; this one takes --prompt")
        prompt = args.prompt if args.prompt is not None else ""
        rewriting = (args.rewrite_prompt if args.rewrite_prompt is not None
                     else getattr(pipe.config, "caption_template", None) is not None)
        used, why = pipe.prompt_for_model(prompt, rewriting)
        if rewriting:
            print(f"prompt {why}", file=sys.stderr)
        # what the model cannot read in the prompt, or a size it never trained at: the notes the app shows
        trained = card.get("trained_on")
        notes = (prompt_note(prompt, args.model, trained, still=task == "text-to-image"),
                 size_note(args.model, trained, frames, height, width) if task == "text-to-video" else "")
        for note in filter(None, notes):
            print(f"note: {note}", file=sys.stderr)
        common.update(prompt=used, negative_prompt=args.negative_prompt, num_frames=frames, rewrite_prompt=False)
        with _flags_named():
            result = pipe(**common).images if task == "text-to-image" else pipe(**common).frames
    for path in save_media(result, out, fps=args.fps):
        print(path)
    return 0

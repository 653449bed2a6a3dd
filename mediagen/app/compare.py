"""The Compare tab's work: one seed through several (attention, text encoder) configurations.

The reference is ``sdpa`` with the FlashAttention encoder (softmax everywhere); it always runs
first. Each configuration reports its stage latencies, its agreement with the reference (PSNR,
SSIM) and reference-free scores (the digit classifier for images, VBench-style and the
Moving-MNIST digit / direction verdicts for videos). For the class-conditional image model the
text encoder plays no part, so configurations that differ only in it are run once.

Agreement with the reference is not quality: two good samples of one prompt may differ everywhere,
and a blank frame shares the reference's dark background, so it scores a high SSIM against a digit
clip while a real clip with its digit elsewhere scores low. So a blank output (no frame with any
contrast, ``is_blank``) gets no PSNR/SSIM at all and is marked ``blank``, and the quality columns
are the reference-free ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from . import generation, scores
from .similarity import psnr, ssim

REFERENCE = ("sdpa", "FlashAttention")
SEPARATOR = " · "
NO_ENCODER = "—"


def config_label(attention: str, encoder: str) -> str:
    """"mhla · MLRA"; just the attention where no text encoder takes part ("—")."""
    return attention if encoder == NO_ENCODER else f"{attention}{SEPARATOR}{encoder}"


def parse_config(label: str, attentions, encoders, task: str | None = None) -> tuple[str, str]:
    """(attention, encoder) of a label "mhla · HLA"; ``attentions``: those offered for the task. The
    class-conditional task has no text encoder: its labels are the attention alone ("mhla", encoder "—");
    a label naming an encoder is taken too, and the encoder is ignored there."""
    parts = str(label).split(SEPARATOR)
    where = f" for {task}" if task else ""
    if task == "class-to-image":
        if not (parts[0] in attentions and (len(parts) == 1 or (len(parts) == 2 and parts[1] in encoders))):
            raise ValueError(f"configs: {label!r} is not allowed{where}: use an attention in {list(attentions)} (the "
                             f"class-conditional model has no text encoder)")
        return parts[0], NO_ENCODER
    if len(parts) != 2 or parts[0] not in attentions or parts[1] not in encoders:
        raise ValueError(f"configs: {label!r} is not allowed{where}: use '<attention>{SEPARATOR}<text encoder>' with "
                         f"attention in {list(attentions)} and text encoder in {list(encoders)}")
    return parts[0], parts[1]


def task_labels(task: str, attentions, encoders) -> list[str]:
    """The configuration labels a task offers: attention x text encoder, or the attention alone for the
    class-conditional task (no text encoder takes part)."""
    if task == "class-to-image":
        return list(attentions)
    return [config_label(a, e) for e in encoders for a in attentions]


def carry_labels(labels, task: str, attentions, encoders) -> list[str]:
    """The configurations picked for one task, as labels of ``task``: the same attentions (and text
    encoders, where the task has them; FlashAttention where the old labels had none), those ``task`` offers."""
    offered = task_labels(task, attentions, encoders)
    out = []
    for label in labels or []:
        attention, *rest = str(label).split(SEPARATOR)
        new = attention if task == "class-to-image" else config_label(attention, rest[0] if rest else REFERENCE[1])
        if new in offered and new not in out:
            out.append(new)
    return out


@dataclass
class CompareRequest:
    task: str                 # "class-to-image", "text-to-image" or "text-to-video"
    configs: list             # [(attention, encoder)], reference first
    seed: int
    steps: int
    guidance: float
    prompt: str = ""
    class_label: int = 0
    height: int = 0
    width: int = 0
    frames: int = 1
    prompts: dict = field(default_factory=dict)   # attention -> (prompt its model is given, "read as: ..." or "")


def plan(task: str, configs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The configurations to run: the reference first, no duplicates (for class images, one per attention)."""
    class_task = task == "class-to-image"

    def key(config):
        return config[0] if class_task else config

    out = []
    for config in [REFERENCE, *configs]:
        if key(config) not in [key(c) for c in out]:
            out.append(config)
    return [(a, NO_ENCODER) for a, _ in out] if class_task else out


def run_one(cache, req: CompareRequest, attention: str, encoder: str, on_step=None) -> generation.Generated:
    if req.task == "class-to-image":
        return generation.class_images(cache, attention, req.class_label, 1, req.seed, req.steps, req.guidance,
                                       on_step=on_step)
    frames = 1 if req.task == "text-to-image" else req.frames
    prompt = req.prompts.get(attention, (req.prompt, ""))[0]
    return generation.text_samples(cache, attention, encoder, prompt, None, 1, req.seed, req.steps,
                                   req.guidance, req.height, req.width, frames, on_step=on_step)


BLANK_CONTRAST = 0.05   # a frame whose pixel spread (std, values in [0, 1]) is below this shows nothing


def is_blank(sample) -> bool:
    """Whether an image (H, W, C) or clip (F, H, W, C) in [0, 1] shows nothing: no frame has a pixel
    spread of ``BLANK_CONTRAST`` (a digit on its background has about 0.3)."""
    a = np.asarray(sample, dtype=np.float64)
    frames = a[None] if a.ndim == 3 else a
    return bool(frames.reshape(len(frames), -1).std(axis=1).max() < BLANK_CONTRAST)


def semantic_verdict(video, prompt: str | None) -> dict:
    """The verdicts of ``mediagen.eval.moving_mnist.score_clips`` for a clip whose prompt names digits,
    with what they rest on: ``digit_ok`` / ``direction_ok``, and ``digit_read`` (the digit each track was
    read as, "none" where no frame shows one) / ``direction_found`` (the way each moved, "none" where it
    moved too little to tell), comma-separated for several digits. A "no" is only useful with what the
    scorer saw. {} when the prompt names no digit or that scorer is not available."""
    from ..eval import moving_mnist

    score_clips = getattr(moving_mnist, "score_clips", None)
    if score_clips is None or not prompt or moving_mnist.parse_prompt(prompt) is None:
        return {}
    verdict = score_clips([video], [prompt])[0]
    out = {k: verdict.get(k) for k in ("digit_ok", "direction_ok")}
    if verdict.get("read") is not None:
        out["digit_read"] = ", ".join("none" if d is None else str(d) for d in verdict["read"])
    if verdict.get("moved") is not None:
        out["direction_found"] = ", ".join(m or "none" for m in verdict["moved"])
    return out


def quality(req: CompareRequest, sample, reference) -> dict:
    blank = is_blank(sample)
    out = {"blank": blank, "psnr_db": None if blank else psnr(sample, reference),
           "ssim": None if blank else ssim(sample, reference)}
    if sample.ndim == 4:                                             # a video (F, H, W, C)
        out.update(scores.video_scores(sample, req.prompt or None))
        out.update(semantic_verdict(sample, req.prompt or None))
    else:
        digit = req.class_label if req.task == "class-to-image" else scores.prompt_digit(req.prompt)
        out.update(scores.digit_scores(sample[None], digit, crop=req.task == "text-to-image"))
    return out


def compare(cache, req: CompareRequest, progress=None) -> list[dict]:
    """One row per configuration: label, stage latencies (ms), quality, the sample itself and each
    denoising step's seconds (``step_seconds``, for the time estimate).
    ``progress(fraction, desc=...)`` hears which configuration runs and its denoising step."""
    rows, reference = [], None
    n = len(req.configs)
    for i, (attention, encoder) in enumerate(req.configs):
        label = config_label(attention, encoder)

        def on_step(done, i=i, label=label):
            if progress is not None:
                progress((i + done / req.steps) / n,
                         desc=f"configuration {i + 1}/{n}: {label}, step {done}/{req.steps}")

        if progress is not None:
            progress(i / n, desc=f"configuration {i + 1}/{n}: {label}, loading")
        result = run_one(cache, req, attention, encoder, on_step)
        sample = result.samples[0]
        reference = sample if reference is None else reference
        ms = {f"{k}_ms": 1e3 * v for k, v in result.timings.items()}
        ms["total_ms"] = sum(ms.values())
        read = req.prompts.get(attention, (req.prompt, ""))
        told = {"prompt_read_as": read[0]} if read[1] else {}   # the prompt as this model was given it
        if result.notes:   # the prompt was longer than the text encoder reads: said, as the Video tab says it
            told["prompt_note"] = " ".join(result.notes)
        rows.append({"config": label, "attention": attention, "text_encoder": encoder, **told, **ms,
                     **quality(req, sample, reference), "sample": sample, "step_seconds": result.step_seconds})
    return rows


def finite(value):
    """JSON-safe numbers: inf/nan become None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value

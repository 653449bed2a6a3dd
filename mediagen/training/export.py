"""From a training run to ``mediagen.pipelines``: build the pipeline around the trained transformer,
write sample images/videos during training, and save the final pipeline folder."""

from __future__ import annotations

import copy
import json
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

from ..pipelines.class_image import ClassConditionalImagePipeline
from ..pipelines.export import save_image, save_video
from ..pipelines.schedulers import make_scheduler
from ..pipelines.shipping import folder_written_atomically
from ..pipelines.text_image import TextToImagePipeline
from ..pipelines.text_video import TextToVideoPipeline
from .lora import fuse_lora_, save_lora

DEFAULT_PROMPTS = ["the digit 3 moves left", "the digit 7 moves down"]


def make_pipeline(components, transformer, scheduler: str, objective):
    """The pipeline around ``transformer``, its scheduler set as ``objective`` (the run's objective config)
    trained: the same shift, or the same token-count rule (``objective.max_shift``)."""
    sched = make_scheduler(scheduler, objective.shift, objective.max_shift, tuple(objective.shift_seq_len),
                           objective.num_train_timesteps)
    if components.task == "class-to-image":
        return ClassConditionalImagePipeline(transformer=transformer, scheduler=sched, vae=components.vae)
    cls = TextToImagePipeline if components.task == "text-to-image" else TextToVideoPipeline
    return cls(transformer=transformer, scheduler=sched, vae=components.vae, text_encoder=components.text_encoder,
               tokenizer=components.tokenizer)


def merged_copy(model, is_lora: bool):
    """A plain (no peft layers) copy of the model for saving: LoRA fused into the weights."""
    model = copy.deepcopy(model)
    if is_lora:
        fuse_lora_(model)
    return model.eval()


@torch.no_grad()
def write_samples(run, step: int, folder: Path | None, writer=None) -> list[Path]:
    """Sample with the current (EMA if any) weights; PNGs for images, GIFs for videos. ``folder``
    None samples without writing (the other processes of a sequence-parallel run)."""
    cfg, comp = run.cfg, run.components
    model = run.unwrapped
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    was_training = model.training
    ctx = run.ema.applied(model) if run.ema is not None else nullcontext()
    paths = []
    with ctx:
        pipe = make_pipeline(comp, model, run.objective.sampling_scheduler(), cfg.objective)
        pipe.set_progress_bar_config(disable=True)
        g = torch.Generator().manual_seed(cfg.train.seed)
        lg = cfg.logging
        size = cfg.data.resolution
        if comp.task == "class-to-image":
            images = pipe(class_labels=list(lg.sample_classes), num_inference_steps=lg.sample_steps,
                          guidance_scale=lg.guidance_scale, generator=g, output_type="np").images
            for label, im in zip(lg.sample_classes if folder is not None else [], images):
                paths.append(save_image(im, folder / f"class{label}.png"))
            grid = images
        else:
            prompts = list(lg.sample_prompts) or DEFAULT_PROMPTS
            common = dict(prompt=prompts, height=size, width=size, num_inference_steps=lg.sample_steps,
                          guidance_scale=lg.guidance_scale, generator=g, output_type="np",
                          max_sequence_length=cfg.model.text_max_length)
            if comp.task == "text-to-image":
                grid = pipe(**common).images
                for i, im in enumerate(grid if folder is not None else []):
                    paths.append(save_image(im, folder / f"prompt{i}.png"))
            else:
                videos = pipe(num_frames=cfg.data.num_frames, **common).frames
                for i, v in enumerate(videos):
                    if folder is not None:
                        paths.append(save_video(v, folder / f"prompt{i}.gif"))
                # TensorBoard's add_video needs moviepy: log each clip's frames side by side instead
                grid = np.stack([np.concatenate(list(v), axis=1) for v in videos])
        if writer is not None:
            writer.add_images("samples/images", np.asarray(grid), step, dataformats="NHWC")
    model.train(was_training)
    return paths


def save_pipeline_atomically(pipe, folder: Path) -> Path:
    """save_pretrained into a hidden sibling folder, then swap it in: a kill never leaves half a folder.

    A component loaded with from_pretrained (a run continued from ``model.pretrained``) carries the
    folder it came from as ``_name_or_path``; that path of the machine that trained it is dropped from
    the saved configs, which are meant to be shared."""
    with folder_written_atomically(folder) as tmp:
        pipe.save_pretrained(str(tmp), safe_serialization=True)
        for config in tmp.glob("*/config.json"):
            data = json.loads(config.read_text())
            if data.pop("_name_or_path", None) is not None:
                config.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return folder


def save_final_pipeline(run, folder: Path) -> Path:
    """Write a pipeline folder ``mediagen generate`` / ``build_pipeline`` can load (EMA weights if any)."""
    ctx = run.ema.applied(run.unwrapped) if run.ema is not None else nullcontext()
    with ctx:
        model = merged_copy(run.unwrapped, run.components.is_lora)
        if run.components.is_lora:   # the adapters the pipeline fuses: the EMA ones when EMA is on
            save_lora(run.unwrapped, folder.parent / "lora")
    pipe = make_pipeline(run.components, model, run.objective.sampling_scheduler(), run.cfg.objective)
    save_pipeline_atomically(pipe, folder)
    return folder


# The settings that decide the pipeline an export writes: the transformer and its conversion (task, model,
# finetune), the text encoder and autoencoder (model), the scheduler (objective), and train.seed, which seeds a
# new byte text encoder, whose weights no checkpoint holds.
EXPORT_KEYS = ("task", "model", "finetune", "objective", "train.seed")


def _export_settings(cfg) -> dict:
    """EXPORT_KEYS as {dotted key: value}, a section's entries one by one (model.pretrained, ...)."""
    from omegaconf import OmegaConf

    settings = {}
    for key in EXPORT_KEYS:
        value = OmegaConf.select(cfg, key)
        if OmegaConf.is_dict(value):
            settings.update({f"{key}.{k}": v for k, v in OmegaConf.to_container(value, resolve=True).items()})
        else:
            settings[key] = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    return settings


def run_config(cfg):
    """The config the run in ``cfg.output_dir`` trained with: its config.yaml, with this command's output_dir
    (the folder may have moved). An export builds the model from it, not from ``cfg``: a command that forgot
    an override of the training command would otherwise build another model, which either fails to load
    the checkpoint or, with another train.seed or objective, writes a wrong pipeline without a word. Says
    in one line which of the EXPORT_KEYS ``cfg`` sets otherwise; a run without config.yaml exports ``cfg``."""
    from omegaconf import OmegaConf

    from .config import load_config

    file = Path(cfg.output_dir) / "config.yaml"
    if not file.is_file():
        print(f"--export: {file} is missing, so the model is built from this command's config")
        return cfg
    # an export resumes nothing, and the checkpoint a resumed run named may have been deleted since (keep_last)
    saved = load_config(file, ["checkpoint.resume=null"])
    saved.output_dir = cfg.output_dir
    if OmegaConf.is_config(cfg):
        ran, here = _export_settings(saved), _export_settings(cfg)
        differ = [k for k in ran if ran[k] != here.get(k)]
        if differ:
            print(f"--export: the model is built from the run's {file}, not this command's config, which differs "
                  f"in " + ", ".join(f"{k}={ran[k]!r} (command: {here.get(k)!r})" for k in differ))
    return saved


def export_checkpoint(cfg, which: str = "latest", folder: str | Path | None = None) -> Path:
    """Write the pipeline of one saved training checkpoint (its EMA weights when it has them) to
    ``folder`` (default ``output_dir/pipeline-step-<N>``): a run stopped by a time limit, or any
    earlier step of a finished one, becomes a folder ``mediagen generate`` / ``mediagen fid`` load.
    The model is built from the run's config.yaml (``run_config``)."""
    from . import checkpoint as ckpt
    from .components import build_components
    from .objectives import Objective

    found = dict(ckpt.list_checkpoints(cfg.output_dir))
    if not found:
        raise ValueError(f"output_dir={cfg.output_dir!r} has no checkpoints to export")
    if which == "latest":
        step = max(found)
    elif str(which).isdigit() and int(which) in found:
        step = int(which)
    else:
        raise ValueError(f"checkpoint {which!r} is not in {cfg.output_dir}: use 'latest' or one of {sorted(found)}")
    folder = Path(folder) if folder is not None else Path(cfg.output_dir) / f"pipeline-step-{step}"
    check_export_folder(folder, cfg.output_dir)
    cfg = run_config(cfg)
    comp = build_components(cfg)
    model = comp.transformer
    from omegaconf import OmegaConf

    model_config = OmegaConf.to_container(cfg.model, resolve=True) if OmegaConf.is_config(cfg.model) else None
    ckpt.load_model_state(model, found[step], cfg.output_dir, model_config)
    ema = ckpt.read_ema(found[step])
    if ema is not None:
        params = dict(model.named_parameters())
        with torch.no_grad():
            for name, value in ema.items():
                params[name].copy_(value)
    model = merged_copy(model, comp.is_lora)
    objective = Objective(cfg.objective)
    pipe = make_pipeline(comp, model, objective.sampling_scheduler(), cfg.objective)
    return save_pipeline_atomically(pipe, folder)


def check_export_folder(folder: Path, output_dir) -> None:
    """The export replaces ``folder`` as a whole, so it must be new or an earlier export (a pipeline folder with
    model_index.json): the run's output_dir (its checkpoints), a folder above it, or any other folder or file
    given to --to by mistake would be deleted."""
    given, folder, run = str(folder), Path(folder).resolve(), Path(output_dir).resolve()
    if folder == run or folder in run.parents:
        raise ValueError(f"--to {given!r} holds the run's output_dir {str(run)!r}, which the export would "
                         f"replace: give a new folder (default: output_dir/pipeline-step-<STEP>)")
    if folder.exists() and not (folder.is_dir() and (folder / "model_index.json").is_file()):
        raise ValueError(f"--to {given!r} exists and is not a pipeline folder, which the export would "
                         f"replace: give a new folder or an earlier export")

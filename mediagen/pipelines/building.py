"""Build a ready pipeline from a preset name (random weights) or a saved folder.

A folder may hold a whole pipeline (``model_index.json``) or just a transformer (``config.json``);
for a bare transformer the pipeline gets the pixel-space ``IdentityAutoencoder`` and, for text
models, a ``ByteTextEncoder`` as wide as the transformer's ``text_dim`` (random weights).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..models.byte_text_encoder import ByteTextEncoder
from ..models.convert import convert
from ..models.identity_autoencoder import IdentityAutoencoder
from ..models.loading import load_transformer
from ..models.presets import PRESETS, build_transformer
from .class_image import ClassConditionalImagePipeline
from .schedulers import make_scheduler
from .shipping import checkpoints_dir, referenced_text_encoder, shipped_checkpoint
from .text_image import TextToImagePipeline
from .text_video import TextToVideoPipeline
from .vae_utils import vae_factors

PIPELINES = {c.__name__: c for c in (ClassConditionalImagePipeline, TextToVideoPipeline, TextToImagePipeline)}


def task_of(transformer) -> str:
    """'class-to-image' for a DiT, 'text-to-video' for a Wan-style transformer."""
    return "text-to-video" if hasattr(transformer.config, "text_dim") else "class-to-image"


def pipeline_around(transformer, scheduler, task: str | None = None):
    """A pixel-space pipeline for ``transformer`` with default components (in eval mode)."""
    task = task or task_of(transformer)
    transformer.eval()
    vae = IdentityAutoencoder(latent_channels=transformer.config.in_channels)
    if task == "class-to-image":
        return ClassConditionalImagePipeline(transformer=transformer, scheduler=scheduler, vae=vae)
    text_dim = transformer.config.text_dim
    encoder = ByteTextEncoder(hidden_size=text_dim, num_heads=4 if text_dim % 4 == 0 else 1).eval()
    cls = TextToImagePipeline if task == "text-to-image" else TextToVideoPipeline
    return cls(transformer=transformer, scheduler=scheduler, vae=vae, text_encoder=encoder)


def build_pipeline(model: str, *, task: str | None = None, attention=None, blocks=None, grid=None,
                   scheduler: str | None = None, shift: float = 3.0, seed: int = 0, device="cpu",
                   dtype=torch.float32):
    """Pipeline from a preset name (random init, seeded) or a folder; ``attention`` converts it."""
    path = Path(model)
    if model not in PRESETS and not path.exists():
        path = shipped_checkpoint(model) or path          # a shipped default, e.g. "image-mhla"
    if model in PRESETS:
        torch.manual_seed(seed)
        transformer = build_transformer(model)
        pipe = pipeline_around(transformer, make_scheduler(scheduler or "flow-euler", shift), task)
    elif (path / "model_index.json").is_file():
        name = json.loads((path / "model_index.json").read_text()).get("_class_name")
        if name not in PIPELINES:
            raise ValueError(f"{path / 'model_index.json'} names _class_name={name!r}; loadable: {sorted(PIPELINES)}")
        referenced = referenced_text_encoder(path)
        # a named encoder is set after loading: diffusers checks a component passed to from_pretrained
        # against the class model_index.json names, and a distilled encoder is not that class
        pipe = PIPELINES[name].from_pretrained(str(path), **dict.fromkeys(referenced))
        if referenced:
            pipe.register_modules(**referenced)
        if scheduler is not None:
            pipe.scheduler = make_scheduler(scheduler, shift)
    elif (path / "config.json").is_file():
        pipe = pipeline_around(load_transformer(path), make_scheduler(scheduler or "flow-euler", shift), task)
    else:
        from .catalog import shipped_names

        raise ValueError(f"model={model!r} is neither a preset ({', '.join(sorted(PRESETS))}), a shipped checkpoint "
                         f"({', '.join(shipped_names())}: folders in {checkpoints_dir()}) nor a folder with "
                         f"model_index.json or config.json")
    if task == "text-to-image" and isinstance(pipe, TextToVideoPipeline) and not isinstance(pipe, TextToImagePipeline):
        config = pipe.config   # components leave out the pipeline's own settings
        pipe = TextToImagePipeline(**pipe.components, caption_template=config.caption_template,
                                   caption_digits=config.caption_digits)
    if attention is not None:
        convert(pipe, attention, blocks=blocks, grid=grid)
    pipe.to(device)
    if dtype != torch.float32:
        pipe.to(dtype=dtype)
    return pipe


def token_grid(pipe, height: int, width: int, num_frames: int | None = None) -> tuple[int, ...]:
    """The transformer's token grid for an output of this size (checks the size first)."""
    if isinstance(pipe, TextToVideoPipeline):
        f, h, w = pipe.check_size(height, width, num_frames or 1)
        p_t, p_h, p_w = pipe.transformer.config.patch_size
        return (f // p_t, h // p_h, w // p_w)
    s = vae_factors(pipe.vae)[1] * pipe.transformer.config.patch_size
    return (height // s, width // s)

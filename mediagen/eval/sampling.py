"""Sampling images and videos from a checkpoint: the one place that touches ``mediagen.pipelines``.

``sample_images(checkpoint, n, batch_size, seed)`` returns uint8 (n, H, W, 3) and
``sample_videos(checkpoint, prompts, ...)`` uint8 (T, H, W, 3) arrays, both in batches with a
progress bar. The metrics never see a pipeline, so everything else works (and is tested) on
images and videos that already exist (``--samples`` / ``--videos``).
"""

from __future__ import annotations

import inspect

import numpy as np
import torch
from tqdm.auto import tqdm


def load_pipeline(checkpoint, device="cpu", dtype=torch.float32):
    """The pipeline saved at ``checkpoint`` (a ``save_pretrained`` folder, a transformer folder, or a
    preset name of ``mediagen.models.presets`` for a random-weight smoke run), in ``dtype``."""
    try:
        from ..pipelines import build_pipeline
    except ImportError as err:  # pragma: no cover - depends on the pipelines package
        raise ValueError(f"--checkpoint needs mediagen.pipelines, which failed to import ({err}); "
                         "pass already generated images with --samples / --videos instead") from err
    try:
        return build_pipeline(str(checkpoint), device=device, dtype=dtype)
    except ValueError as err:
        raise ValueError(f"--checkpoint {checkpoint!r} could not be loaded: {err}") from err


def _to_uint8(x) -> np.ndarray:
    """Pipeline output (PIL list, float [0, 1] array/tensor, or uint8) as a uint8 numpy array."""
    if isinstance(x, (list, tuple)) and x and hasattr(x[0], "convert"):
        return np.stack([np.asarray(im.convert("RGB")) for im in x])
    if isinstance(x, torch.Tensor):
        x = x.detach().float().cpu().numpy()
    x = np.asarray(x)
    if x.dtype == np.uint8:
        return x
    return (np.clip(x, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def _call(pipe, batch: int, seed: int, index: int, prompts=None, num_classes=None, **kwargs):
    params = inspect.signature(pipe.__call__).parameters
    gen = torch.Generator(device="cpu").manual_seed(seed + index)
    call = {k: v for k, v in kwargs.items() if k in params and v is not None}
    if "generator" in params:
        call["generator"] = gen
    if "output_type" in params:
        call["output_type"] = "np"
    if prompts is not None and "prompt" in params:
        call["prompt"] = [prompts[(index + j) % len(prompts)] for j in range(batch)]
    elif "class_labels" in params:
        n_cls = num_classes or 10
        call["class_labels"] = [(index + j) % n_cls for j in range(batch)]
    elif "batch_size" in params:
        call["batch_size"] = batch
    elif "num_images_per_prompt" in params:
        call["num_images_per_prompt"] = batch
    out = pipe(**call)
    for name in ("images", "frames", "videos"):
        if hasattr(out, name):
            return getattr(out, name)
    return out[0] if isinstance(out, (tuple, list)) else out


def sample_images(checkpoint, n: int, batch_size: int = 16, seed: int = 0, device="cpu", prompts=None,
                  num_classes=None, progress=True, **kwargs) -> np.ndarray:
    """n images (uint8 (n, H, W, 3)) from the pipeline at ``checkpoint``; image i uses seed + batch start."""
    pipe = load_pipeline(checkpoint, device)
    if hasattr(pipe, "set_progress_bar_config"):
        pipe.set_progress_bar_config(disable=True)
    out = []
    for start in tqdm(range(0, n, batch_size), desc="sampling", disable=not progress, unit="batch"):
        b = min(batch_size, n - start)
        imgs = _to_uint8(_call(pipe, b, seed, start, prompts, num_classes, **kwargs))
        out.append(imgs[:b])
    images = np.concatenate(out)
    if images.ndim == 4 and images.shape[-1] == 1:
        images = np.repeat(images, 3, axis=-1)
    return images


def swap_text_encoder(pipe, name: str, device="cpu"):
    """Condition ``pipe`` through another text encoder (a ``load_text_encoder`` name or folder, e.g. a
    distilled MLRA / HLA encoder standing in for the MiniLM the model was trained with)."""
    from ..text.encoders import load_text_encoder

    encoder = load_text_encoder(name, device=device)
    width = getattr(pipe.transformer.config, "text_dim", None)
    if width is not None and encoder.hidden_size != width:
        raise ValueError(f"text_encoder={name!r} gives {encoder.hidden_size}-d states; the transformer takes {width}")
    encoder.model.to(dtype=pipe.transformer.dtype)   # in the pipeline's precision, as its own encoder is
    pipe.register_modules(text_encoder=encoder.model, tokenizer=encoder.tokenizer)
    return pipe


def sample_videos(checkpoint, prompts, seed: int = 0, device="cpu", progress=True, batch_size: int = 1,
                  text_encoder: str | None = None, dtype=torch.float32, **kwargs) -> list[np.ndarray]:
    """One video (uint8 (T, H, W, 3)) per prompt from the pipeline at ``checkpoint`` in ``dtype``,
    ``batch_size`` prompts per call (the batch starting at prompt i uses seed + i)."""
    pipe = load_pipeline(checkpoint, device, dtype)
    if text_encoder is not None:
        swap_text_encoder(pipe, text_encoder, device)
    if hasattr(pipe, "set_progress_bar_config"):
        pipe.set_progress_bar_config(disable=True)
    videos = []
    for start in tqdm(range(0, len(prompts), batch_size), desc="sampling videos", disable=not progress):
        chunk = list(prompts[start:start + batch_size])
        # _call takes prompt index + j of the list it is given: the whole list, so a short last chunk
        # (start not a multiple of its length) is not rotated
        out = _to_uint8(_call(pipe, len(chunk), seed, start, list(prompts), **kwargs))
        for video in (out if out.ndim == 5 else out[None]):
            if video.shape[-1] == 1:
                video = np.repeat(video, 3, axis=-1)
            videos.append(video)
    return videos

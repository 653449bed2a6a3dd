"""The Compare tab's work: one seed through several (attention, text encoder) configurations.

The reference is ``sdpa`` with the FlashAttention encoder (softmax everywhere); it always runs
first. Each configuration reports its stage latencies, its agreement with the reference (PSNR,
SSIM) and reference-free scores (the digit classifier for images, VBench-style for videos).
For the class-conditional image model the text encoder plays no part, so configurations that
differ only in it are run once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import generation, scores
from .similarity import psnr, ssim

REFERENCE = ("sdpa", "FlashAttention")
SEPARATOR = " · "
NO_ENCODER = "—"


def config_label(attention: str, encoder: str) -> str:
    """"mhla · MLRA"; just the attention where no text encoder takes part ("—")."""
    return attention if encoder == NO_ENCODER else f"{attention}{SEPARATOR}{encoder}"


def parse_config(label: str, attentions, encoders) -> tuple[str, str]:
    parts = str(label).split(SEPARATOR)
    if len(parts) != 2 or parts[0] not in attentions or parts[1] not in encoders:
        raise ValueError(f"configuration {label!r} is not allowed: use '<attention>{SEPARATOR}<text encoder>' with "
                         f"attention in {list(attentions)} and text encoder in {list(encoders)}")
    return parts[0], parts[1]


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


def run_one(cache, req: CompareRequest, attention: str, encoder: str) -> generation.Generated:
    if req.task == "class-to-image":
        return generation.class_images(cache, attention, req.class_label, 1, req.seed, req.steps, req.guidance)
    frames = 1 if req.task == "text-to-image" else req.frames
    return generation.text_samples(cache, attention, encoder, req.prompt, None, 1, req.seed, req.steps,
                                   req.guidance, req.height, req.width, frames)


def quality(req: CompareRequest, sample, reference) -> dict:
    out = {"psnr_db": psnr(sample, reference), "ssim": ssim(sample, reference)}
    if sample.ndim == 4:                                             # a video (F, H, W, C)
        out.update(scores.video_scores(sample, req.prompt or None))
    else:
        digit = req.class_label if req.task == "class-to-image" else scores.prompt_digit(req.prompt)
        out.update(scores.digit_scores(sample[None], digit))
    return out


def compare(cache, req: CompareRequest, progress=None) -> list[dict]:
    """One row per configuration: label, stage latencies (ms), quality, and the sample itself."""
    rows, reference = [], None
    for i, (attention, encoder) in enumerate(req.configs):
        label = config_label(attention, encoder)
        if progress is not None:
            progress(i / len(req.configs), desc=f"{label} ({i + 1}/{len(req.configs)})")
        result = run_one(cache, req, attention, encoder)
        sample = result.samples[0]
        reference = sample if reference is None else reference
        ms = {f"{k}_ms": 1e3 * v for k, v in result.timings.items()}
        ms["total_ms"] = sum(ms.values())
        rows.append({"config": label, "attention": attention, "text_encoder": encoder, **ms,
                     **quality(req, sample, reference), "sample": sample})
    return rows


def finite(value):
    """JSON-safe numbers: inf/nan become None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value

"""Reference-free quality scores of one output, as the Compare tab reports them.

Images: the shipped MNIST digit classifier. For a class-conditional digit (or a prompt naming a
digit) ``digit_prob`` is the classifier's probability of the asked-for digit; ``confidence`` is its
top probability (how digit-like the image is, whatever the digit). Class images are made grey and
resized to 28x28 whole; a prompt-mode still is read in the digit-sized box around its ink, as the clip
scorer reads a frame.
Videos: the VBench-style dimensions of ``mediagen.eval`` (subject consistency on the digit
classifier's features of the crop around the ink, background consistency on whole-frame pixels), the Moving-MNIST semantic scores when the prompt names digits, and
the VBench Quality / Semantic / Total aggregates. A dimension a clip is too short for is left out.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def _grey28(images: np.ndarray) -> torch.Tensor:
    """(N, H, W, C) in [0, 1] -> (N, 1, 28, 28)."""
    x = torch.as_tensor(np.asarray(images, dtype=np.float32)).permute(0, 3, 1, 2).mean(1, keepdim=True)
    return F.interpolate(x, size=(28, 28), mode="bilinear", align_corners=False, antialias=True)


def _ink_crops(images: np.ndarray) -> torch.Tensor:
    """(N, H, W, C) in [0, 1] -> (N, 1, 28, 28): each image's digit-sized box around its ink, as the clip
    scorer reads a frame (``mediagen.eval.moving_mnist.digit_groups``), brightest pixel 1."""
    from ..eval.moving_mnist import as_grey_clip, digit_groups

    crops = [digit_groups(as_grey_clip(np.asarray(image)[None]), 1)[1][0, 0] / 255.0 for image in images]
    return torch.as_tensor(np.stack(crops), dtype=torch.float32)[:, None]


@torch.no_grad()
def digit_scores(images: np.ndarray, digit: int | None, crop: bool = False) -> dict[str, float]:
    """Mean classifier scores over a batch of images (N, H, W, C) in [0, 1]. ``crop``: the digit is one
    frame of a clip model's canvas (a prompt-mode still, 7/16 of the side), read in its box around the ink
    as the clip scorer reads it; else the whole image is the digit (class-conditional MNIST images)."""
    from ..eval.digit_classifier import load_digit_classifier

    probs = load_digit_classifier("cpu")(_ink_crops(images) if crop else _grey28(images)).softmax(-1)
    scores = {"confidence": float(probs.max(-1).values.mean()),
              "predicted": int(probs.mean(0).argmax())}
    if digit is not None:
        scores["digit_prob"] = float(probs[:, digit].mean())
    return scores


def prompt_digit(prompt: str | None) -> int | None:
    """The first digit a prompt names ("the digit 7", "a seven"), or None."""
    from ..eval.moving_mnist import parse_prompt

    parsed = parse_prompt(prompt) if prompt else None
    return parsed.digits[0] if parsed else None


def video_scores(video: np.ndarray, prompt: str | None, fps: float | None = None) -> dict[str, float]:
    """VBench-style scores of one video (F, H, W, C) in [0, 1]: raw dimensions plus aggregates."""
    from ..eval import vbench_quality as q
    from ..eval.fid import extract_features
    from ..eval.frame_features import get_frame_extractor
    from ..eval.moving_mnist import parse_prompt, semantic_scores
    from ..eval.vbench_score import aggregate

    frames = (np.clip(np.asarray(video, dtype=np.float32), 0, 1) * 255).round().astype(np.uint8)
    if frames.shape[-1] == 1:
        frames = np.repeat(frames, 3, axis=-1)
    raw: dict[str, float] = {}
    if len(frames) >= 2:
        # the subject on the digit classifier's features of the crop around the ink, the background on
        # whole-frame pixels: two measurements, so Quality does not count one score twice
        for key, features in (("subject_consistency", "digit-crop"), ("background_consistency", "pixels")):
            feats = extract_features(list(frames), get_frame_extractor(features), 32, progress=False)
            total, count = q.consistency_from_features(feats)
            raw[key] = total / count
        raw["temporal_flickering"] = q.temporal_flickering(frames)
        raw["dynamic_degree"] = float(q.dynamic_degree(frames, fps))
    if len(frames) >= 3:
        raw["motion_smoothness"] = q.motion_smoothness(frames)
    parsed = parse_prompt(prompt) if prompt else None
    verdicts = {}
    if parsed is not None and len(frames) >= 2:
        for key, value in semantic_scores(frames, parsed, "cpu").items():
            # yes/no verdicts (digit_ok, ...) are reported as they are, not aggregated as dimensions
            (verdicts if value is None or isinstance(value, bool) else raw)[key] = value
    if not raw:
        return verdicts
    report = aggregate(raw)
    out = {**raw, **verdicts}
    for key in ("quality", "semantic", "total"):
        if report[key] is not None:
            out[f"vbench_{key}"] = report[key]
    return out

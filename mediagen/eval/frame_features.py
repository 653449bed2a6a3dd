"""Per-frame features for subject/background consistency: any FID extractor
(``effnet-lite0`` default, ``mnist``, ``inception``) or ``pixels`` (raw 32x32 RGB, no network)."""

from __future__ import annotations

import torch

from .features import FEATURES, FeatureExtractor, get_extractor


class PixelFeatures(FeatureExtractor):
    """Raw pixels of the frame resized to 32x32, centred per frame: a network-free baseline."""

    name, dim, size = "pixels", 32 * 32 * 3, 32

    def embed(self, x):
        flat = x.flatten(1)
        return flat - flat.mean(dim=1, keepdim=True)


FRAME_FEATURES = sorted([*FEATURES, "pixels"])


def get_frame_extractor(name: str, device="cpu", inception_weights=None) -> FeatureExtractor:
    if name == "pixels":
        return PixelFeatures(torch.device(device))
    if name not in FEATURES:
        raise ValueError(f"frame features {name!r} are not allowed: use one of {FRAME_FEATURES}")
    return get_extractor(name, device, inception_weights)

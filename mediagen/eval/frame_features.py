"""Per-frame features for subject/background consistency: any FID extractor (``effnet-lite0``,
``mnist``, ``inception``), ``pixels`` (raw 32x32 RGB, no network) or ``digit-crop`` (the digit
classifier's features of a digit-sized box around the frame's ink, the subject of a Moving-MNIST
clip).

Defaults: subject consistency on ``digit-crop`` and background consistency on ``effnet-lite0``.
They must differ: with the same features both dimensions are one score counted twice in Quality.
The subject is the digit, so its features follow the digit wherever it moves and ignore the
empty frame around it (as VBench's DINO features of the subject do); the background is the whole
frame's look (as VBench's CLIP features).
"""

from __future__ import annotations

import numpy as np
import torch

from .features import FEATURES, FeatureExtractor, get_extractor

DEFAULT_SUBJECT_FEATURES = "digit-crop"
DEFAULT_BACKGROUND_FEATURES = "effnet-lite0"


class PixelFeatures(FeatureExtractor):
    """Raw pixels of the frame resized to 32x32, centred per frame: a network-free baseline."""

    name, dim, size = "pixels", 32 * 32 * 3, 32

    def embed(self, x):
        flat = x.flatten(1)
        return flat - flat.mean(dim=1, keepdim=True)


class DigitCropFeatures(FeatureExtractor):
    """The digit classifier's 128-d hidden activations (after the ReLU its head reads) of the subject:
    frames resized to 64x64 (the Moving-MNIST size), the box around the ink centroid cut out as
    ``mediagen.eval.moving_mnist`` does for classification, brightest pixel scaled to 255. A frame
    without ink gives the empty box's features. Activations, not the pre-activation FID features:
    those share a large common part, so unlike crops (noise) still look alike (cosine 0.97 against
    0.88 after the ReLU)."""

    name, dim, size = "digit-crop", 128, 64

    def __init__(self, device="cpu"):
        super().__init__(device)
        from .digit_classifier import load_digit_classifier

        self.model = load_digit_classifier(self.device)

    def embed(self, x):
        from .moving_mnist import digit_groups

        grey = x.mean(dim=1).clamp(0, 255).cpu().numpy().astype(np.float32)  # (B, 64, 64) in [0, 255]
        if np.median(grey) > 127.5:  # dark ink on a light background
            grey = 255.0 - grey
        crops = digit_groups(grey, 1)[1][:, 0]  # every frame on its own: the batch is not a clip here
        return torch.relu(self.model.features(torch.from_numpy(crops / 255.0)[:, None].to(self.device)))


FRAME_FEATURES = sorted([*FEATURES, "pixels", "digit-crop"])


def get_frame_extractor(name: str, device="cpu", inception_weights=None) -> FeatureExtractor:
    if name == "pixels":
        return PixelFeatures(torch.device(device))
    if name == "digit-crop":
        return DigitCropFeatures(torch.device(device))
    if name not in FEATURES:
        raise ValueError(f"frame features {name!r} are not allowed: use one of {FRAME_FEATURES}")
    return get_extractor(name, device, inception_weights)

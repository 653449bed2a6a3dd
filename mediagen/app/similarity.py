"""Agreement of two outputs in [0, 1]: PSNR and SSIM (Wang et al. 2004: 11x11 Gaussian window,
sigma 1.5, K1 = 0.01, K2 = 0.03, data range 1), on images (H, W, C) or videos (F, H, W, C).

SSIM of a colour image is the mean over channels; of a video, the mean over frames. Windows are
clipped at the border (``reflect`` padding), so images smaller than the window still score.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def _as_frames(x) -> torch.Tensor:
    """(frames, channels, H, W) float64 from (H, W, C) or (F, H, W, C)."""
    a = torch.as_tensor(np.asarray(x, dtype=np.float64))
    if a.dim() == 3:
        a = a[None]
    if a.dim() != 4:
        raise ValueError(f"expected an image (H, W, C) or a video (F, H, W, C); got shape {tuple(a.shape)}")
    return a.permute(0, 3, 1, 2)


def _check_pair(a: torch.Tensor, b: torch.Tensor):
    if a.shape != b.shape:
        raise ValueError(f"outputs to compare have different shapes: {tuple(a.shape)} and {tuple(b.shape)}")


def psnr(x, reference, data_range: float = 1.0) -> float:
    """Peak signal-to-noise ratio in dB; ``inf`` for identical inputs."""
    a, b = _as_frames(x), _as_frames(reference)
    _check_pair(a, b)
    mse = float(((a - b) ** 2).mean())
    return float("inf") if mse == 0 else float(10 * np.log10(data_range ** 2 / mse))


def _gaussian_window(size: int = 11, sigma: float = 1.5) -> torch.Tensor:
    r = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    g = torch.exp(-(r ** 2) / (2 * sigma ** 2))
    g = g / g.sum()
    return (g[:, None] * g[None, :])[None, None]


def ssim(x, reference, data_range: float = 1.0) -> float:
    """Mean structural similarity in [-1, 1]; 1 for identical inputs."""
    a, b = _as_frames(x), _as_frames(reference)
    _check_pair(a, b)
    f, c, h, w = a.shape
    a, b = a.reshape(f * c, 1, h, w), b.reshape(f * c, 1, h, w)
    window = _gaussian_window()
    pad = window.shape[-1] // 2
    mode = "reflect" if min(h, w) > pad else "replicate"

    def blur(t):
        return F.conv2d(F.pad(t, (pad, pad, pad, pad), mode=mode), window)

    mu_a, mu_b = blur(a), blur(b)
    var_a = blur(a * a) - mu_a ** 2
    var_b = blur(b * b) - mu_b ** 2
    cov = blur(a * b) - mu_a * mu_b
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    s = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a ** 2 + mu_b ** 2 + c1) * (var_a + var_b + c2))
    return float(s.mean())

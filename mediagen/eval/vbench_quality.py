"""VBench's quality dimensions on uint8 videos (T, H, W, 3), one function per dimension.

- Temporal flickering, exactly as VBench: (255 - mean over consecutive frame pairs of the mean
  absolute pixel difference) / 255.
- Subject / background consistency, VBench's formula on pluggable frame features f_i:
  mean over i >= 1 of [max(0, cos(f_i, f_{i-1})) + max(0, cos(f_i, f_0))] / 2. VBench uses DINO
  (subject) and CLIP (background) features; here any extractor of ``mediagen.eval.frame_features``
  serves: by default the digit classifier on a box around the ink for the subject and
  EfficientNet-Lite0 on the whole frame for the background (different features, so the two
  dimensions are not one score counted twice).
- Motion smoothness, stand-in for VBench's AMT frame interpolation: VBench drops the odd frames,
  re-creates them by interpolating their even neighbours, and scores (255 - MAE(real, interpolated))
  / 255. We interpolate with OpenCV's Farneback optical flow instead of AMT: with flow F from frame
  2i to 2i+2, the middle frame is the mean of frame 2i sampled at x - F/2 and frame 2i+2 sampled at
  x + F/2 (a linear-motion assumption, as frame interpolation makes).
- Dynamic degree, stand-in for VBench's RAFT: the same rule on Farneback flow between consecutive
  frames. Per pair, the mean of the top 5% flow magnitudes; a video is dynamic when at least
  round(4 n / 16) pairs (and at least one) exceed 6 * min(H, W) / 256 pixels (n = frames scored).
  Frames are first subsampled to about 8 fps when the frame rate is known, as VBench does.
"""

from __future__ import annotations

import numpy as np


def temporal_flickering(video: np.ndarray) -> float:
    v = np.asarray(video).astype(np.float64)
    if len(v) < 2:
        raise ValueError(f"temporal flickering needs at least 2 frames; got {len(v)}")
    mae = np.abs(v[1:] - v[:-1]).reshape(len(v) - 1, -1).mean(axis=1)  # one MAE per consecutive pair
    return float((255.0 - mae.mean()) / 255.0)


def consistency_from_features(feats: np.ndarray) -> tuple[float, int]:
    """(sum over frames i >= 1 of the VBench frame score, number of such frames) for (T, d) features."""
    f = np.asarray(feats, dtype=np.float64)
    if len(f) < 2:
        raise ValueError(f"consistency needs at least 2 frames; got {len(f)}")
    f = f / np.maximum(np.linalg.norm(f, axis=1, keepdims=True), 1e-12)
    to_prev = np.clip((f[1:] * f[:-1]).sum(1), 0.0, None)
    to_first = np.clip(f[1:] @ f[0], 0.0, None)
    return float(((to_prev + to_first) / 2).sum()), len(f) - 1


def consistency(video: np.ndarray, extractor, batch_size: int = 32) -> float:
    """Per-video subject/background consistency with frame features from ``extractor``."""
    from .fid import extract_features

    feats = extract_features(list(video), extractor, batch_size, progress=False)
    total, count = consistency_from_features(feats)
    return total / count


def _grey(frame: np.ndarray) -> np.ndarray:
    import cv2

    return cv2.cvtColor(np.ascontiguousarray(frame), cv2.COLOR_RGB2GRAY)


def farneback_flow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Dense optical flow (H, W, 2) from grey frame a to grey frame b: a(x) ~ b(x + flow(x))."""
    import cv2

    return cv2.calcOpticalFlowFarneback(a, b, None, pyr_scale=0.5, levels=3, winsize=15, iterations=3,
                                        poly_n=5, poly_sigma=1.2, flags=0)


def _sample(frame: np.ndarray, dx: np.ndarray, dy: np.ndarray) -> np.ndarray:
    import cv2

    h, w = frame.shape[:2]
    xs, ys = np.meshgrid(np.arange(w, dtype=np.float32), np.arange(h, dtype=np.float32))
    return cv2.remap(frame.astype(np.float32), xs + dx, ys + dy, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)


def interpolate_middle(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Estimate the frame halfway between RGB frames a and b (float32) from the flow a -> b."""
    flow = farneback_flow(_grey(a), _grey(b))
    half_x, half_y = flow[..., 0] / 2, flow[..., 1] / 2
    return (_sample(a, -half_x, -half_y) + _sample(b, half_x, half_y)) / 2


def motion_smoothness(video: np.ndarray) -> float:
    v = np.asarray(video)
    if len(v) < 3:
        raise ValueError(f"motion smoothness needs at least 3 frames; got {len(v)}")
    errors = [np.abs(interpolate_middle(v[i - 1], v[i + 1]) - v[i].astype(np.float32)).mean()
              for i in range(1, len(v) - 1, 2)]
    return float((255.0 - np.mean(errors)) / 255.0)


def subsample_to_8fps(video: np.ndarray, fps: float | None) -> np.ndarray:
    if not fps or fps <= 8:
        return video
    return video[:: max(1, round(fps / 8))]


def dynamic_degree(video: np.ndarray, fps: float | None = None) -> bool:
    """True when the video is dynamic by VBench's rule (on Farneback flow)."""
    v = subsample_to_8fps(np.asarray(video), fps)
    if len(v) < 2:
        raise ValueError(f"dynamic degree needs at least 2 frames; got {len(v)}")
    h, w = v.shape[1:3]
    threshold = 6.0 * min(h, w) / 256.0
    needed = max(1, round(4 * len(v) / 16))
    grey = [_grey(f) for f in v]
    moving_pairs = 0
    for a, b in zip(grey[:-1], grey[1:]):
        mag = np.linalg.norm(farneback_flow(a, b), axis=-1).ravel()
        top = np.sort(mag)[-max(1, int(len(mag) * 0.05)):]  # the 5% largest magnitudes
        moving_pairs += top.mean() > threshold
    return bool(moving_pairs >= needed)

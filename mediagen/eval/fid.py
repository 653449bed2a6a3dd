"""FID and KID from image features.

FID (Heusel et al.): ||mu1 - mu2||^2 + tr(S1) + tr(S2) - 2 tr((S1 S2)^(1/2)).
The eigenvalues of S1 S2 equal those of the symmetric PSD matrix S1^(1/2) S2 S1^(1/2), so
tr((S1 S2)^(1/2)) = sum_i sqrt(lambda_i) with lambda from ``eigvalsh``; no complex ``sqrtm``, so
no "Imaginary component" failure. It agrees with clean-fid's ``frechet_distance`` to rounding
(tests/test_eval_fid.py checks it against ``cleanfid.fid.compute_fid``).

KID (Binkowski et al.): the unbiased MMD^2 with the cubic polynomial kernel
k(x, y) = (x.y / d + 1)^3, averaged over random subsets as clean-fid does; seeded here.
"""

from __future__ import annotations

import numpy as np
import torch
from tqdm.auto import tqdm


def check_enough_samples(n: int, dim: int, what: str = "samples", features: str = "", fix: str = "") -> None:
    """FID needs a full-rank covariance estimate: more samples than feature dimensions. ``fix`` says
    which flag set ``n`` and what to give instead (e.g. "--num-samples=300 is too few: use
    --num-samples 1281 or more"), so the one-line error says what to change."""
    if n <= dim:
        from .features import FEATURE_DIMS

        label = f"features {features!r} of dimension {dim}" if features else f"{dim}-d features"
        lower = [f"{name} ({d}-d, needs {d + 1})" for name, d in sorted(FEATURE_DIMS.items(), key=lambda x: x[1])
                 if d < dim]
        todo = fix or f"use at least {dim + 1} {what}"
        if lower:
            todo += ", or a lower-dimensional --features: " + ", ".join(lower)
        raise ValueError(f"FID needs more {what} than the feature dimension (ideally several times more): "
                         f"got {n} {what} for {label}; {todo}")


def to_rgb_uint8(img: np.ndarray) -> np.ndarray:
    """One image (H, W), (H, W, 1), (H, W, 3) or (H, W, 4) as uint8 (H, W, 3)."""
    img = np.asarray(img)
    if img.dtype != np.uint8:
        raise ValueError(f"images must be uint8 in 0..255; got dtype {img.dtype}")
    if img.ndim == 2:
        img = img[..., None]
    if img.ndim != 3 or img.shape[-1] not in (1, 3, 4):
        raise ValueError(f"an image must be (H, W), (H, W, 1), (H, W, 3) or (H, W, 4); got shape {img.shape}")
    if img.shape[-1] == 1:
        img = np.repeat(img, 3, axis=-1)
    return np.ascontiguousarray(img[..., :3])


def extract_features(images, extractor, batch_size: int = 64, progress: bool = True, desc: str = "features"):
    """(N, dim) float64 features of a sequence of uint8 images (any sizes; each resized by the extractor)."""
    feats = []
    n = len(images)
    for start in tqdm(range(0, n, batch_size), desc=desc, disable=not progress, unit="batch"):
        batch = [extractor.resize(to_rgb_uint8(images[i])) for i in range(start, min(n, start + batch_size))]
        x = torch.from_numpy(np.stack(batch).astype(np.float32)).permute(0, 3, 1, 2)
        feats.append(extractor(x).double().cpu().numpy())
    if not feats:
        return np.zeros((0, extractor.dim))
    return np.concatenate(feats)


def feature_stats(feats: np.ndarray):
    """Mean and (unbiased, as numpy's cov) covariance of (N, dim) features."""
    feats = np.asarray(feats, dtype=np.float64)
    return feats.mean(axis=0), np.cov(feats, rowvar=False)


def frechet_distance(mu1, sigma1, mu2, sigma2) -> float:
    mu1, mu2 = np.atleast_1d(mu1).astype(np.float64), np.atleast_1d(mu2).astype(np.float64)
    s1, s2 = np.atleast_2d(sigma1).astype(np.float64), np.atleast_2d(sigma2).astype(np.float64)
    if mu1.shape != mu2.shape or s1.shape != s2.shape:
        raise ValueError(f"feature statistics differ in dimension: mu {mu1.shape} vs {mu2.shape}, "
                         f"sigma {s1.shape} vs {s2.shape} (were they made with the same --features?)")
    # S1^(1/2) through its eigen-decomposition (S1 is symmetric PSD; clip rounding negatives).
    w, v = np.linalg.eigh((s1 + s1.T) / 2)
    root1 = (v * np.sqrt(np.clip(w, 0, None))) @ v.T
    middle = root1 @ s2 @ root1
    lam = np.linalg.eigvalsh((middle + middle.T) / 2)
    tr_covmean = np.sqrt(np.clip(lam, 0, None)).sum()
    diff = mu1 - mu2
    return float(diff @ diff + np.trace(s1) + np.trace(s2) - 2.0 * tr_covmean)


def kernel_distance(feats1, feats2, num_subsets: int = 100, max_subset_size: int = 1000, seed: int = 0) -> float:
    """KID: mean over subsets of the unbiased MMD^2 with k(x, y) = (x.y/d + 1)^3."""
    f1, f2 = np.asarray(feats1, np.float64), np.asarray(feats2, np.float64)
    d = f1.shape[1]
    m = min(len(f1), len(f2), max_subset_size)
    if m < 2:
        raise ValueError(f"KID needs at least 2 samples per set; got {len(f1)} and {len(f2)}")
    rng = np.random.default_rng(seed)
    total = 0.0
    for _ in range(num_subsets):
        x = f2[rng.choice(len(f2), m, replace=False)]
        y = f1[rng.choice(len(f1), m, replace=False)]
        kxx, kyy, kxy = (x @ x.T / d + 1) ** 3, (y @ y.T / d + 1) ** 3, (x @ y.T / d + 1) ** 3
        # within-set sums without the diagonal: unbiased estimates of E k(x, x') and E k(y, y')
        within = (kxx.sum() - np.trace(kxx) + kyy.sum() - np.trace(kyy)) / (m * (m - 1))
        total += within - 2.0 * kxy.sum() / (m * m)
    return float(total / num_subsets)


def fid_from_features(feats, ref_mu, ref_sigma, features: str = "") -> float:
    check_enough_samples(len(feats), np.asarray(feats).shape[1], "samples", features)
    mu, sigma = feature_stats(feats)
    return frechet_distance(mu, sigma, ref_mu, ref_sigma)


def split_fids(feats, ref_mu, ref_sigma, splits: int, features: str = "") -> list[float]:
    """FID of each of ``splits`` disjoint, equal, consecutive parts of the samples (a remainder is left out):
    the spread of the estimate at n / splits samples. FID is biased upwards at smaller n, so these are
    comparable with each other and with another model's splits of the same size, not with the full FID.
    Two models sampled with the same seeds and labels pair up split by split."""
    feats = np.asarray(feats)
    if splits < 2:
        raise ValueError(f"splits={splits} is not allowed: use 2 or more disjoint parts")
    size = len(feats) // splits
    check_enough_samples(size, feats.shape[1], "samples per split", features)
    return [fid_from_features(feats[i * size:(i + 1) * size], ref_mu, ref_sigma, features) for i in range(splits)]

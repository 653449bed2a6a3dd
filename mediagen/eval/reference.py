"""FID/KID reference sets: ``mnist`` (the shipped 10,000 real digits), a folder of images, or a
statistics file written by ``save_reference_stats`` (``mu``, ``sigma``, optional ``feats`` for KID,
and the name of the features they were made with)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .fid import check_enough_samples, extract_features, feature_stats


@dataclass
class ReferenceStats:
    mu: np.ndarray
    sigma: np.ndarray
    feats: np.ndarray | None  # kept for KID; a stats file may omit them
    features: str
    n: int
    source: str


def reference_images(spec: str, limit: int | None = None):
    """The images of a reference spec that is 'mnist' or a folder / .npz / .npy path."""
    from .image_io import load_images

    if spec == "mnist":
        from ..data import load_mnist10k

        images, _ = load_mnist10k("all")
        return images[:limit] if limit else images
    return load_images(spec, limit)


def load_reference(spec: str, extractor, batch_size: int = 64, limit: int | None = None,
                   progress: bool = True) -> ReferenceStats:
    path = Path(spec)
    if spec != "mnist" and path.is_file() and path.suffix == ".npz" and _is_stats_file(path):
        return load_reference_stats(path, extractor.name)
    if spec != "mnist" and not path.exists():
        raise ValueError(f"--reference {spec!r} is not allowed: use 'mnist', a folder of images, "
                         "an .npz/.npy of uint8 images, or a statistics .npz (mu, sigma)")
    images = reference_images(spec, limit)
    check_enough_samples(len(images), extractor.dim, "reference images", extractor.name)
    feats = extract_features(images, extractor, batch_size, progress, desc=f"reference {extractor.name}")
    mu, sigma = feature_stats(feats)
    return ReferenceStats(mu, sigma, feats, extractor.name, len(feats), spec)


def _is_stats_file(path: Path) -> bool:
    with np.load(path, allow_pickle=False) as data:
        return "mu" in data and "sigma" in data


def load_reference_stats(path, features: str) -> ReferenceStats:
    with np.load(path, allow_pickle=False) as data:
        made_with = str(data["features"]) if "features" in data else None
        if made_with is not None and made_with != features:
            raise ValueError(f"reference statistics {path} were made with --features {made_with}, "
                             f"but --features {features} was asked for")
        feats = data["feats"] if "feats" in data else None
        n = int(data["n"]) if "n" in data else (len(feats) if feats is not None else -1)
        return ReferenceStats(data["mu"], data["sigma"], feats, features, n, str(path))


def save_reference_stats(ref: ReferenceStats, path, keep_feats: bool = True) -> None:
    """Write the statistics (to a temporary name, then renamed)."""
    arrays = {"mu": ref.mu, "sigma": ref.sigma, "features": np.array(ref.features), "n": np.array(ref.n)}
    if keep_feats and ref.feats is not None:
        arrays["feats"] = ref.feats.astype(np.float32)
    tmp = str(path) + ".tmp.npz"
    np.savez_compressed(tmp, **arrays)
    os.replace(tmp, path)

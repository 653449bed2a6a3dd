"""FID/KID reference sets: the shipped real digits, a folder of images, or a statistics file written
by ``save_reference_stats`` (``mu``, ``sigma``, optional ``feats`` for KID, the name of the features
they were made with and ``reference_set``, which images they came from).

The digit models train on the first 8,000 of ``mnist10k.npz`` and hold out the last 2,000
(``mediagen.data``), so the digit references are named by that split:

  mnist         the 2,000 held-out digits (default): samples are compared with digits no model saw,
                which scores generalisation rather than recall of the training set
  mnist-train   the 8,000 training digits: the distribution the model was fitted to
  mnist-all     all 10,000 (8,000 of them training digits); needed for --features inception, whose
                2,048 dimensions want more than 2,000 reference images
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..data import MNIST_HELD_OUT, MNIST_TRAIN
from .fid import check_enough_samples, extract_features, feature_stats


@dataclass
class ReferenceStats:
    mu: np.ndarray
    sigma: np.ndarray
    feats: np.ndarray | None  # kept for KID; a stats file may omit them
    features: str
    n: int
    source: str
    reference_set: str = ""  # which images the statistics describe, recorded in the FID JSON


# reference name -> split of mediagen.data.load_mnist10k; sizes and ranges follow the split's slices
MNIST_REFERENCES = {"mnist": "held_out", "mnist-train": "train", "mnist-all": "all"}
_SLICES = {"held_out": MNIST_HELD_OUT, "train": MNIST_TRAIN, "all": slice(0, MNIST_HELD_OUT.stop)}
MNIST_SPLIT_SIZES = {k: v.stop - v.start for k, v in _SLICES.items()}
_NOTES = {"held_out": "not trained on", "train": "the training images",
          "all": f"{MNIST_SPLIT_SIZES['train']} of them training images"}
MNIST_SPLIT_LABELS = {k: f"mnist10k {k}: digits {v.start}-{v.stop - 1}, {_NOTES[k]}" for k, v in _SLICES.items()}


def mnist_reference_set(spec: str, limit: int | None = None) -> str:
    """The description of a digit reference recorded in the results (``limit``: first N only)."""
    split = MNIST_REFERENCES[spec]
    n = min(limit, MNIST_SPLIT_SIZES[split]) if limit else MNIST_SPLIT_SIZES[split]
    return f"{MNIST_SPLIT_LABELS[split]} ({n} images)"


def check_reference_count(spec: str, dim: int, features: str, limit: int | None = None) -> None:
    """For the digit references the count is known without loading anything: check it before any work."""
    if spec not in MNIST_REFERENCES:
        return
    size = MNIST_SPLIT_SIZES[MNIST_REFERENCES[spec]]
    n = min(limit, size) if limit else size
    if n > dim:
        return
    if size > dim:
        fix = f"--reference-num={limit} is too few: use --reference-num {dim + 1} or more, or leave it out"
    else:
        larger = [f"--reference {k} ({MNIST_SPLIT_SIZES[v]})" for k, v in MNIST_REFERENCES.items()
                  if MNIST_SPLIT_SIZES[v] > dim]
        fix = f"--reference {spec} holds {size} images" + (f": use {' or '.join(larger)}" if larger else "")
    check_enough_samples(n, dim, "reference images", features, fix)


def check_reference_spec(spec: str) -> None:
    """A digit reference name or an existing path (checked before any sampling)."""
    if spec not in MNIST_REFERENCES and not Path(spec).exists():
        raise ValueError(f"--reference {spec!r} is not allowed: use {', '.join(repr(k) for k in MNIST_REFERENCES)}, "
                         "a folder of images, an .npz/.npy of uint8 images, or a statistics .npz (mu, sigma)")


def reference_images(spec: str, limit: int | None = None):
    """The images of a reference spec that is a digit reference (``MNIST_REFERENCES``) or a folder /
    .npz / .npy path."""
    from .image_io import load_images

    if spec in MNIST_REFERENCES:
        from ..data import load_mnist10k

        images, _ = load_mnist10k(MNIST_REFERENCES[spec])
        return images[:limit] if limit else images
    return load_images(spec, limit)


def load_reference(spec: str, extractor, batch_size: int = 64, limit: int | None = None,
                   progress: bool = True) -> ReferenceStats:
    path = Path(spec)
    digits = spec in MNIST_REFERENCES
    if not digits and path.is_file() and path.suffix == ".npz" and _is_stats_file(path):
        return load_reference_stats(path, extractor.name)
    check_reference_spec(spec)
    if digits:
        check_reference_count(spec, extractor.dim, extractor.name, limit)
    images = reference_images(spec, limit)
    if limit:  # the reference holds at least ``limit`` images (load_images checks): --reference-num cut it short
        fix = (f"--reference-num={limit} is too few: use --reference-num {extractor.dim + 1} or more, "
               "or leave it out")
    else:
        fix = f"--reference {spec} holds {len(images)} images: give {extractor.dim + 1} or more"
    check_enough_samples(len(images), extractor.dim, "reference images", extractor.name, fix)
    feats = extract_features(images, extractor, batch_size, progress, desc=f"reference {extractor.name}")
    mu, sigma = feature_stats(feats)
    described = mnist_reference_set(spec, limit) if digits else f"images in {spec} ({len(feats)} images)"
    return ReferenceStats(mu, sigma, feats, extractor.name, len(feats), spec, described)


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
        described = (str(data["reference_set"]) if "reference_set" in data
                     else "not recorded in the statistics file")
        return ReferenceStats(data["mu"], data["sigma"], feats, features, n, str(path), described)


def save_reference_stats(ref: ReferenceStats, path, keep_feats: bool = True) -> None:
    """Write the statistics (to a temporary name, then renamed)."""
    arrays = {"mu": ref.mu, "sigma": ref.sigma, "features": np.array(ref.features), "n": np.array(ref.n),
              "reference_set": np.array(ref.reference_set)}
    if keep_feats and ref.feats is not None:
        arrays["feats"] = ref.feats.astype(np.float32)
    tmp = str(path) + ".tmp.npz"
    np.savez_compressed(tmp, **arrays)
    os.replace(tmp, path)

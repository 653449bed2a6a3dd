"""The shipped digit classifier: held-out accuracy and the shipped data file."""

import hashlib

import torch

from mediagen.data import MNIST10K_SHA256, load_mnist10k, mnist10k_path
from mediagen.eval.digit_classifier import classify_digits, load_digit_classifier, weights_path


def test_shipped_digits_are_the_shared_file():
    data = mnist10k_path().read_bytes()
    assert hashlib.sha256(data).hexdigest() == MNIST10K_SHA256
    images, labels = load_mnist10k("held_out")
    assert images.shape == (2000, 28, 28) and labels.shape == (2000,)


def test_classifier_accuracy_on_held_out_digits():
    images, labels = load_mnist10k("held_out")
    pred = classify_digits(images)
    acc = (pred == torch.from_numpy(labels)).float().mean().item()
    assert acc >= 0.98, f"held-out accuracy {acc:.4f} < 0.98"
    # and the classifier is not a constant: every class is predicted
    assert set(pred.tolist()) == set(range(10))


def test_weights_are_safetensors():
    from safetensors import safe_open

    with safe_open(str(weights_path()), "pt") as fh:
        assert "trained_on" in fh.metadata()
    assert sum(p.numel() for p in load_digit_classifier().parameters()) > 100_000

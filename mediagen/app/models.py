"""Which models the app serves, and a cache that loads each one once.

``default_models()`` is the one place that decides what the app runs: the shipped checkpoints
(docs/RESULTS.md) where present, else the small presets with seeded random weights: ``dit-mnist``
for class-conditional digits (shipped trained with sdpa, mhla and linear attention), ``wan-mmnist``
for text-to-video and text-to-image as one frame (shipped trained with sdpa and mhla), and MiniLM
text encoders: the real all-MiniLM-L6-v2 through SDPA (the FlashAttention path) and the MLRA / HLA
encoders distilled from it (shipped; initialised from it otherwise). Shipped checkpoints are picked
up from a folder
(``MEDIAGEN_CHECKPOINTS``, default ``mediagen/checkpoints``) laid out as

    image-<attention>/    a class-conditional pipeline or transformer trained with that attention
    video-<attention>/    a text-to-video pipeline or transformer          (attention: sdpa, mhla,
    text-mlra/, text-hla/ saved ``PromptEncoder`` folders                    linear or hybrid)

An attention without its own checkpoint is converted from the ``sdpa`` one (or the preset).
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..pipelines.shipping import checkpoints_dir

# app label -> mediagen.convert name
ATTENTIONS = {"sdpa": "sdpa", "mhla": "mhla", "linear": "linear", "hybrid": "wan-mhla-h"}
TEXT_ENCODERS = ("FlashAttention", "MLRA", "HLA")
FAMILIES = ("image", "video")  # image: class-conditional DiT; video: Wan-style text-to-video


@dataclass
class ModelSource:
    """base: a preset name, a preset dict (``mediagen.models.presets``) or a saved folder;
    trained: attention label -> folder trained with that attention; size: default output size."""

    base: str | dict
    trained: dict[str, str] = field(default_factory=dict)
    size: dict = field(default_factory=dict)


@dataclass
class ModelSet:
    image: ModelSource
    video: ModelSource
    text_encoders: dict[str, str]                                  # label -> load_text_encoder name
    text_encoder_options: dict[str, dict] = field(default_factory=dict)

    def source(self, family: str) -> ModelSource:
        if family not in FAMILIES:
            raise ValueError(f"model family {family!r} is not known: use one of {FAMILIES}")
        return self.image if family == "image" else self.video


def _trained(root: Path, family: str) -> dict[str, str]:
    found = {}
    for label in ATTENTIONS:
        folder = root / f"{family}-{label}"
        if (folder / "model_index.json").is_file() or (folder / "config.json").is_file():
            found[label] = str(folder)
    return found


def default_models(root: str | Path | None = None) -> ModelSet:
    """The models the app serves: shipped checkpoints where present, small presets otherwise."""
    from ..models.presets import PRESETS

    root = Path(root) if root is not None else checkpoints_dir()
    video = PRESETS["wan-mmnist"]
    encoders = {"FlashAttention": "minilm", "MLRA": "minilm-mlra2", "HLA": "minilm-hla"}
    for label, short in (("MLRA", "mlra"), ("HLA", "hla")):
        if (root / f"text-{short}" / "config.json").is_file():
            encoders[label] = str(root / f"text-{short}")
    return ModelSet(
        image=ModelSource("dit-mnist", _trained(root, "image")),
        video=ModelSource("wan-mmnist", _trained(root, "video"),
                          size={k: video[k] for k in ("frames", "height", "width")}),
        text_encoders=encoders)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class ModelCache:
    """Loads every model at most once (thread-safe) and hands out ready transformers and encoders.

    A transformer is kept per (family, attention, MHLA blocks): presets are converted for the token
    grid of the request (blocks chosen by ``auto_blocks``), trained checkpoints are used as saved.
    """

    def __init__(self, models: ModelSet, device=None, dtype=None):
        self.models = models
        self.device = torch.device(device) if device is not None else default_device()
        self.dtype = dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        self._lock = threading.RLock()
        self._bases: dict = {}
        self._vaes: dict = {}
        self._transformers: dict = {}
        self._encoders: dict = {}
        self._encoder_locks: dict = {}

    # --- base pipelines (CPU, float32: the source of every conversion) ----------------------
    def base(self, family: str):
        with self._lock:
            if family not in self._bases:
                self._bases[family] = self._load_base(family)
            return self._bases[family]

    def _load_base(self, family: str):
        from ..models.presets import build_transformer
        from ..pipelines.building import build_pipeline, pipeline_around
        from ..pipelines.schedulers import make_scheduler

        src = self.models.source(family)
        task = "class-to-image" if family == "image" else "text-to-video"
        base = src.trained.get("sdpa", src.base)
        if isinstance(base, dict):
            torch.manual_seed(0)
            pipe = pipeline_around(build_transformer(base), make_scheduler("flow-euler"), task)
        else:
            pipe = build_pipeline(base, task=task, seed=0)
        return pipe

    def vae(self, family: str):
        with self._lock:
            if family not in self._vaes:
                self._vaes[family] = self._place(copy.deepcopy(self.base(family).vae))
            return self._vaes[family]

    def scheduler(self, family: str):
        """A fresh scheduler per request: schedulers hold per-run state."""
        return copy.deepcopy(self.base(family).scheduler)

    # --- transformers per attention ----------------------------------------------------------
    def blocks_for(self, family: str, attention: str, grid) -> tuple | None:
        if attention not in ATTENTIONS:
            raise ValueError(f"attention={attention!r} is not allowed: use one of {list(ATTENTIONS)}")
        if attention in self.models.source(family).trained or "mhla" not in ATTENTIONS[attention]:
            return None
        from ..models.attention_spec import auto_blocks

        return tuple(auto_blocks(grid))

    def transformer(self, family: str, attention: str, grid):
        blocks = self.blocks_for(family, attention, grid)
        key = (family, attention, blocks)
        with self._lock:
            if key not in self._transformers:
                self._transformers[key] = self._load_transformer(family, attention, blocks)
            return self._transformers[key]

    def _load_transformer(self, family: str, attention: str, blocks):
        from ..models.convert import convert
        from ..pipelines.building import build_pipeline

        src = self.models.source(family)
        if attention in src.trained:
            model = build_pipeline(src.trained[attention], seed=0).transformer
        else:
            model = convert(copy.deepcopy(self.base(family).transformer), ATTENTIONS[attention],
                            blocks=list(blocks) if blocks else None)
        return self._place(model)

    def _place(self, module):
        module = module.to(self.device)
        return (module.to(dtype=self.dtype) if self.dtype != torch.float32 else module).eval()

    # --- text encoders -------------------------------------------------------------------------
    def text_encoder(self, label: str):
        names = self.models.text_encoders
        if label not in names:
            raise ValueError(f"text encoder {label!r} is not allowed: use one of {list(names)}")
        with self._lock:
            if label not in self._encoders:
                self._encoders[label] = self._load_encoder(label)
            return self._encoders[label]

    def encoder_lock(self, label: str) -> threading.Lock:
        """One request at a time per text encoder: a Hugging Face fast tokenizer is not thread-safe
        ("Already borrowed" when two threads change its padding/truncation at once)."""
        with self._lock:
            return self._encoder_locks.setdefault(label, threading.Lock())

    def _load_encoder(self, label: str):
        from ..models.text_encoders import load_text_encoder

        options = self.models.text_encoder_options.get(label, {})
        encoder = load_text_encoder(self.models.text_encoders[label], torch_dtype=self.dtype, device=self.device,
                                    **options)
        text_dim = self.base("video").transformer.config.text_dim
        if encoder.hidden_size != text_dim:
            raise ValueError(f"text encoder {label} ({self.models.text_encoders[label]}) gives {encoder.hidden_size}-d "
                             f"states but the video model reads text_dim={text_dim}")
        return encoder

    def preload(self, attentions=("sdpa",), log=print) -> None:
        """Load the base models, every text encoder and the given attentions at default sizes."""
        from .sizes import default_grid

        for family in FAMILIES:
            log(f"loading the {family} model")
            for attention in attentions:
                self.transformer(family, attention, default_grid(self, family))
            self.vae(family)
        for label in self.models.text_encoders:
            log(f"loading the {label} text encoder")
            self.text_encoder(label)

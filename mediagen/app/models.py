"""Which models the app serves, what each one is, and a cache that loads each one once.

``default_models()`` is the one place that decides what the app runs: the shipped checkpoints
(docs/RESULTS.md), picked up from a folder (``MEDIAGEN_CHECKPOINTS``, default ``mediagen/checkpoints``)
laid out as

    image-<attention>/    a class-conditional pipeline or transformer trained with that attention
    video-<attention>/    a text-to-video pipeline or transformer (text-to-image = one frame)
    text-mlra/, text-hla/ saved ``PromptEncoder`` folders      (<attention>: a label of ``attention_labels()``)

Only trained models are offered: an attention is on offer for a family exactly when its
``<family>-<attention>/`` checkpoint exists (an untrained conversion of the sdpa weights gives blank
grids, so it is never offered silently). A family with no checkpoint at all (a checkout without
them) falls back to its preset (``dit-mnist``, ``wan-mmnist``) with random weights, sdpa only, and
says so in its info line. Model sets built by hand (tests, experiments) may list attentions to
serve untrained in ``ModelSource.untrained``; their info lines say "untrained" too. Text encoders:
the real all-MiniLM-L6-v2 through SDPA (the FlashAttention path) and the MLRA / HLA encoders
distilled from it (``text-mlra/``, ``text-hla/``; initialised from MiniLM otherwise).

Model card: a checkpoint folder may hold ``card.json``, read for the info line shown under the
attention choice. Every key is optional:

    {
      "trained_steps": 40000,            optimizer steps (int)
      "clips_seen": 2560000,             training samples seen: clips for video, "images_seen" for images
      "images_seen": 1280000,
      "scores": {"digit_ok": 0.91,       name -> number, measured on this checkpoint as shipped
                 "direction_ok": 0.84},
      "measured_on": "512 clips, 20 steps, seed 0",   what the scores were measured on (one line)
      "note": "one line shown as is"
    }

The info line is one line (name, training steps, scores; "scores: not measured" without a card or
without "scores"); the samples seen, "measured_on" and "note" open under it on a click.
"""

from __future__ import annotations

import copy
import html
import json
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..models.attention_spec import attention_choices, uses_blocks
from ..pipelines.names import CHECKPOINT_LABELS
from ..pipelines.shipping import checkpoints_dir

# The page lists the softmax baseline first, then MHLA, then the other attentions in the registry's order.
# Only the order is chosen here: the names come from the registry and the labels from the shipped folders.
_SHOWN_FIRST = ("sdpa", "mhla")


def attention_labels() -> dict[str, str]:
    """App label (the <attention> of a <family>-<attention>/ folder: the name, or a pattern's label) ->
    ``mediagen.convert`` name, in the page's order; read from the registry on each call."""
    order = sorted(attention_choices(), key=lambda n: _SHOWN_FIRST.index(n) if n in _SHOWN_FIRST else len(_SHOWN_FIRST))
    return {CHECKPOINT_LABELS.get(name, name): name for name in order}


def __getattr__(name):
    if name == "ATTENTIONS":  # the labels as a mapping, as the registry has them now
        return attention_labels()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
TEXT_ENCODERS = ("FlashAttention", "MLRA", "HLA")
FAMILIES = ("image", "video")  # image: class-conditional DiT; video: Wan-style text-to-video


@dataclass
class ModelSource:
    """base: a preset name, a preset dict (``mediagen.models.presets``) or a saved folder;
    trained: attention label -> folder trained with that attention; size: default output size."""

    base: str | dict
    trained: dict[str, str] = field(default_factory=dict)
    size: dict = field(default_factory=dict)
    untrained: tuple[str, ...] = ()    # attentions served without training (converted from base)

    def offered(self) -> list[str]:
        """Attention labels on offer, in ``attention_labels()`` order: the trained ones, then any listed untrained."""
        return [a for a in attention_labels() if a in self.trained or a in self.untrained]


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

    def check_attention(self, family: str, attention, field_name: str = "attention") -> str:
        """``attention`` if the family offers it, else a one-line ValueError naming the field, the value
        and what is allowed."""
        offered = self.source(family).offered()
        if attention not in offered:
            what = "class-conditional image" if family == "image" else "text-to-video / text-to-image"
            why = ("" if attention not in attention_labels() else
                   f" (no trained {family}-{attention} checkpoint; untrained conversions are not offered)")
            raise ValueError(f"{field_name}={attention!r} is not allowed for the {what} model{why}: "
                             f"choose one of {offered}")
        return attention


def read_card(folder) -> dict:
    """The checkpoint's ``card.json`` (module docstring) as a dict; {} when absent. A card that is
    not a JSON object comes back as {"error": ...} so the info line can say so."""
    path = Path(folder) / "card.json"
    if not path.is_file():
        return {}
    try:
        card = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        return {"error": f"card.json unreadable ({err})"}
    return card if isinstance(card, dict) else {"error": "card.json is not a JSON object"}


def _count(value) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return str(value)
    return f"{value:,.0f}"


def _score(value) -> str:
    """A card's score as shown: four significant digits; a float keeps its point (a rate of 1.0 reads
    "1.0", not the count "1")."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        text = f"{value:.4g}"
        return text + ".0" if isinstance(value, float) and text.lstrip("-").isdigit() else text
    return str(value)


def model_name(models: "ModelSet", family: str, attention: str) -> str:
    """"video-mhla" for a trained checkpoint; "<preset> (<attention>, untrained)" otherwise."""
    src = models.source(family)
    if attention in src.trained:
        return Path(src.trained[attention]).name
    base = src.base if isinstance(src.base, str) else "custom preset"
    return f"{base} ({attention}, untrained)"


def model_info(models: "ModelSet", family: str, attention: str) -> str:
    """One short line saying what the model behind (family, attention) is: training steps and scores
    from its card, "not measured" without them; untrained models say so. The rest of the card (what
    the scores were measured on, its note) is ``model_details``."""
    src = models.source(family)
    name = model_name(models, family, attention)
    if attention not in src.trained:
        source = "converted from the sdpa checkpoint" if "sdpa" in src.trained else "random weights"
        return f"{name}: untrained ({source}), outputs are not meaningful; scores: not measured"
    return f"{name}: {_card_line(read_card(src.trained[attention]))}"


def model_details(models: "ModelSet", family: str, attention: str) -> str:
    """The model card beyond its one line (markdown bullets), "" when there is nothing more."""
    src = models.source(family)
    return _card_details(read_card(src.trained[attention])) if attention in src.trained else ""


def _card_line(card: dict) -> str:
    """What a model card says in one line: "11,223 training steps; digit 0.965, direction 1.0"."""
    if "error" in card:
        return f"trained; {card['error']}; scores: not measured"
    steps = (f"{_count(card['trained_steps'])} training steps" if "trained_steps" in card
             else "trained (steps not recorded)")
    scores = card.get("scores")
    if isinstance(scores, dict) and scores:
        return f"{steps}; " + ", ".join(f"{k} {_score(v)}" for k, v in scores.items())
    return f"{steps}; scores: not measured"


def _card_details(card: dict) -> str:
    """The rest of a card, as markdown bullets: samples seen, what the scores were measured on, the note."""
    if "error" in card:
        return ""
    lines = []
    seen = [f"{_count(card[key])} {noun} seen" for key, noun in (("clips_seen", "clips"), ("images_seen", "images"))
            if key in card]
    if seen:
        lines.append("training: " + ", ".join(seen))
    if card.get("measured_on") and isinstance(card.get("scores"), dict) and card["scores"]:
        lines.append(f"scores measured on: {card['measured_on']}")
    if card.get("note"):
        lines.append(str(card["note"]))
    return "\n".join(f"- {line}" for line in lines)


def info_markdown(line: str, details: str = "") -> str:
    """An info line for the page: the line itself, and when there are details, the line as the summary of
    a collapsed ``<details>`` element that opens on a click (a card's full text ran to seven lines and
    pushed the controls below it down)."""
    if not details:
        return line
    return f"<details><summary>{html.escape(line)}</summary>\n\n{details}\n\n</details>"


def encoder_info(models: "ModelSet", label: str) -> str:
    """One line saying what the text encoder behind ``label`` is: the real MiniLM, a distilled encoder
    (its folder's card.json: distillation steps, scores; the rest in ``encoder_details``), or MiniLM's
    weights in other attention layers without distillation, which the video models cannot read as they
    were trained to."""
    name = models.text_encoders.get(label)
    if name is None:
        return ""
    if name == "minilm":
        return (f"{label}: the real all-MiniLM-L6-v2, softmax attention through SDPA; the video models were "
                "trained on its token states")
    if not (Path(name) / "config.json").is_file():
        return (f"{label}: all-MiniLM-L6-v2's weights in {label} attention layers, not distilled ({name}): the "
                "video models do not read its states as they were trained to; scores: not measured")
    return f"{label} ({Path(name).name}): {_card_line(read_card(name))}"


def encoder_details(models: "ModelSet", label: str) -> str:
    """The distilled encoder's card beyond its one line, "" when there is nothing more."""
    name = models.text_encoders.get(label)
    if name is None or name == "minilm" or not (Path(name) / "config.json").is_file():
        return ""
    return _card_details(read_card(name))


def describe_models(models: "ModelSet") -> str:
    """The served checkpoints by name, for the page's intro."""
    parts = []
    for family, what in (("image", "class-conditional digits"), ("video", "text-to-video, and text-to-image as one frame")):
        names = [model_name(models, family, a) for a in models.source(family).offered()]
        parts.append(f"{', '.join(names) or 'none'} ({what})")
    return "; ".join(parts)


def _trained(root: Path, family: str) -> dict[str, str]:
    found = {}
    for label in attention_labels():
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
    image, clips = _trained(root, "image"), _trained(root, "video")
    # a family without any checkpoint: its preset, sdpa only, labelled untrained (see the docstring)
    return ModelSet(
        image=ModelSource("dit-mnist", image, untrained=() if image else ("sdpa",)),
        video=ModelSource("wan-mmnist", clips, size={k: video[k] for k in ("frames", "height", "width")},
                          untrained=() if clips else ("sdpa",)),
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
        self.models.check_attention(family, attention)
        if attention in self.models.source(family).trained or not uses_blocks(attention_labels()[attention]):
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
            model = convert(copy.deepcopy(self.base(family).transformer), attention_labels()[attention],
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
        from ..text.encoders import load_text_encoder

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
                if attention in self.models.source(family).offered():
                    self.transformer(family, attention, default_grid(self, family))
            self.vae(family)
        for label in self.models.text_encoders:
            log(f"loading the {label} text encoder")
            self.text_encoder(label)

"""Which models the app serves, what each one is, and a cache that loads each one once.

``default_models()`` builds what the app runs from the shipped checkpoints as ``pipelines.catalog`` resolves
them (the folders under ``MEDIAGEN_CHECKPOINTS``, default ``mediagen/checkpoints``, and their card.json;
docs/RESULTS.md): an attention is on offer for a family exactly when the family has a checkpoint of it, a
family with no checkpoint at all falls back to its preset (``dit-mnist``, ``wan-mmnist``) with random
weights, sdpa only, and says so in its info line, and each task starts on the checkpoint whose card names
it in "default_for". Model sets built by hand (tests, experiments) may list attentions to serve untrained
in ``ModelSource.untrained``; their info lines say "untrained" too. Text encoders: the real
all-MiniLM-L6-v2 through SDPA (the FlashAttention path) and the MLRA / HLA encoders distilled from it
(``text-mlra/``, ``text-hla/``; initialised from MiniLM otherwise). An encoder is offered for a task only while
its card's measured rate of drawing the asked digit stays within 3 points of MiniLM's (``catalog.MINILM_MARGIN``):
``ModelSet.encoders_for`` lists the ones offered, ``encoder_note`` says in one line why others are not, and
``check_encoder`` refuses a request that names one anyway.

The info line under the attention choice is the checkpoint's card in one line (``catalog.card_line``:
name, training steps, scores; "scores: not measured" without a card or without "scores"); the samples
seen, "measured_on" and "note" open under it on a click.
"""

from __future__ import annotations

import copy
import html
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..models.attention_spec import uses_blocks
from ..pipelines import catalog
from ..pipelines.catalog import attention_labels, read_card

TEXT_ENCODERS = tuple(catalog.TEXT_ENCODERS)
FAMILIES = tuple(catalog.FAMILIES)  # image: class-conditional DiT; video: Wan-style text-to-video


def __getattr__(name):
    if name == "ATTENTIONS":  # label -> mediagen.convert name, as the registry has them now
        return attention_labels()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass
class ModelSource:
    """base: a preset name, a preset dict (``mediagen.models.presets``) or a saved folder;
    trained: attention label -> folder trained with that attention; size: default output size; served: the
    largest size the trained checkpoints learned (their cards), which a CPU server's bounds widen to."""

    base: str | dict
    trained: dict[str, str] = field(default_factory=dict)
    size: dict = field(default_factory=dict)
    served: dict = field(default_factory=dict)
    untrained: tuple[str, ...] = ()    # attentions served without training (converted from base)
    defaults: dict[str, str] = field(default_factory=dict)   # task -> the label it starts on (the cards')

    def offered(self) -> list[str]:
        """Attention labels on offer, in ``attention_labels()`` order: the trained ones and any listed untrained."""
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

    def first_choice(self, task: str) -> str:
        """The attention a tab starts on for ``task``: the default its family's cards name, else the first
        one offered."""
        src = self.source(catalog.family_for_task(task).name)
        offered = src.offered()
        return src.defaults[task] if src.defaults.get(task) in offered else offered[0]

    def encoder_shortfall(self, task: str, label: str) -> dict | None:
        """The measurement that withholds text encoder ``label`` from ``task`` (``catalog.encoder_shortfall``:
        more than 3 points below MiniLM), None when it is offered."""
        name = self.text_encoders.get(label)
        return None if name is None else catalog.encoder_shortfall(catalog.encoder_card(name), task)

    def encoders_for(self, task: str) -> list[str]:
        """The text encoder labels offered for ``task``, in ``text_encoders`` order."""
        return [label for label in self.text_encoders if self.encoder_shortfall(task, label) is None]

    def encoder_note(self, task: str) -> str:
        """One line saying which text encoders are not offered for ``task`` and why (their cards' rates against
        MiniLM's); "" when every encoder is offered."""
        short = {label: row for label in self.text_encoders if (row := self.encoder_shortfall(task, label))}
        if not short:
            return ""
        labels = list(short)
        names = labels[0] if len(labels) == 1 else f"{', '.join(labels[:-1])} and {labels[-1]}"
        what = "video" if task == "text-to-video" else task
        verb, pronoun = ("is", "it") if len(labels) == 1 else ("are", "them")
        rows = list(short.values())
        if len({(r.get("model"), r["minilm_digit"]) for r in rows}) == 1:
            rates = " / ".join(_percent(r["digit"]) for r in rows)
            through = (f"through {pronoun} {_drawer(rows[0])} draws the asked digit in {rates} of clips against "
                       f"MiniLM's {_percent(rows[0]['minilm_digit'])}")
        else:
            through = "; ".join(f"through {label} {_drawer(r)} draws the asked digit in {_percent(r['digit'])} of "
                                f"clips against MiniLM's {_percent(r['minilm_digit'])}" for label, r in short.items())
        plural = "s" if len(labels) > 1 else ""
        return (f"The {names} text encoder{plural} {verb} not offered for {what}: {through}, {_below()} "
                "(docs/RESULTS.md)")

    def check_encoder(self, task: str, label, field_name: str = "text_encoder") -> str:
        """``label`` if it is offered for ``task``, else a one-line ValueError naming the field, the value, why
        (for an encoder withheld from the task) and what is allowed."""
        offered = self.encoders_for(task)
        if isinstance(label, str) and label in offered:
            return label
        why = self.encoder_why(task, label) if isinstance(label, str) else ""
        why = f" ({why})" if why else ""
        raise ValueError(f"{field_name}={label!r} is not allowed for {task}{why}: choose one of {offered}")

    def encoder_why(self, task: str, label: str) -> str:
        """Why text encoder ``label`` is withheld from ``task``, in a phrase; "" when it is not withheld."""
        row = self.encoder_shortfall(task, label)
        return "" if row is None else (
            f"through it {_drawer(row)} draws the asked digit in {_percent(row['digit'])} of clips against "
            f"MiniLM's {_percent(row['minilm_digit'])}, {_below()}; docs/RESULTS.md")

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


def _percent(rate: float) -> str:
    """A rate as the page shows it: 0.725 -> "72.5%", 0.7 -> "70%"."""
    return f"{round(100 * rate, 1):g}%"


def _below() -> str:
    return f"more than {round(100 * catalog.MINILM_MARGIN, 1):g} points below"


def _drawer(row: dict) -> str:
    """Who drew the clips of a "vs_minilm" measurement: the model it names, else "the video model"."""
    model = row.get("model")
    return model if isinstance(model, str) and model else "the video model"


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
    return f"{name}: {catalog.card_line(read_card(src.trained[attention]))}"


def model_details(models: "ModelSet", family: str, attention: str) -> str:
    """The model card beyond its one line (markdown bullets), "" when there is nothing more."""
    src = models.source(family)
    return catalog.card_details(read_card(src.trained[attention])) if attention in src.trained else ""


def served_size(source: ModelSource) -> dict:
    """The size a server's bounds must allow for ``source``: the largest its checkpoints trained at, else the size
    its page starts at."""
    return dict(source.served or source.size)


def trained_on(models: "ModelSet", family: str, attention: str) -> dict:
    """What the checkpoint behind (family, attention) was trained on: its card's "trained_on" (for video models:
    digits per clip, the caption wording); {} for an untrained model or a card without it."""
    src = models.source(family)
    value = read_card(src.trained[attention]).get("trained_on") if attention in src.trained else None
    return value if isinstance(value, dict) else {}


def caption_template(models: "ModelSet", family: str, attention: str) -> str | None:
    """The caption template the checkpoint behind (family, attention) was trained on, as its card declares it
    (``catalog.caption_template``): prompts are rewritten to it by default. None for an untrained model or a
    card without one."""
    src = models.source(family)
    return catalog.caption_template(read_card(src.trained[attention])) if attention in src.trained else None


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
    return f"{label} ({Path(name).name}): {catalog.card_line(read_card(name))}"


def encoder_details(models: "ModelSet", label: str) -> str:
    """The distilled encoder's card beyond its one line, "" when there is nothing more."""
    name = models.text_encoders.get(label)
    if name is None or name == "minilm" or not (Path(name) / "config.json").is_file():
        return ""
    return catalog.card_details(read_card(name))


def describe_models(models: "ModelSet") -> str:
    """The served checkpoints by name, for the page's intro."""
    parts = []
    for family in FAMILIES:
        names = [model_name(models, family, a) for a in models.source(family).offered()]
        parts.append(f"{', '.join(names) or 'none'} ({catalog.family(family).what})")
    return "; ".join(parts)


def default_models(root: str | Path | None = None) -> ModelSet:
    """The models the app serves: shipped checkpoints where present, small presets otherwise (``catalog``)."""
    from ..models.presets import PRESETS

    def source(family: str, **extra) -> ModelSource:
        trained = {label: str(folder) for label, folder in catalog.checkpoints(family, root).items()}
        # a family without any checkpoint: its preset, sdpa only, labelled untrained (module docstring)
        return ModelSource(catalog.family(family).preset, trained, untrained=() if trained else ("sdpa",),
                           defaults=catalog.defaults(family, root), **extra)

    # the video size the page starts at: the default checkpoint's own (its card), else the preset's
    video = catalog.default_size("video", root) or PRESETS[catalog.family("video").preset]
    video = {k: video[k] for k in catalog.SIZE_KEYS}
    # the largest size the checkpoints trained at: the bounds must let every trained size be asked for, while
    # the page starts at the default (a size that answers quickly on a CPU)
    return ModelSet(image=source("image"),
                    video=source("video", size=video, served=catalog.largest_trained_size("video", root) or {}),
                    text_encoders=catalog.text_encoders(root))


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
        self._schedulers: dict = {}
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
        task = catalog.family(family).tasks[0]
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

    def scheduler(self, family: str, attention: str | None = None):
        """A fresh scheduler per request (schedulers hold per-run state): the one saved with the checkpoint behind
        ``attention`` where it has one, else the base pipeline's. A checkpoint samples on the noise schedule it
        was trained on: a long-clip model's shift follows the token count (3 at 1,024 tokens, 8.5 at 8,192), the
        base's is fixed."""
        key = (family, attention)
        with self._lock:
            saved = self._schedulers.get(key)
        if saved is None:
            saved = self._saved_scheduler(family, attention) or self.base(family).scheduler
            with self._lock:
                saved = self._schedulers.setdefault(key, saved)
        return copy.deepcopy(saved)

    def _saved_scheduler(self, family: str, attention: str | None):
        """The scheduler in a trained pipeline folder's ``scheduler/`` (the class its config names); None for a
        transformer-only folder, a preset or an untrained attention."""
        import diffusers

        folder = self.models.source(family).trained.get(attention) if attention is not None else None
        config = Path(folder) / "scheduler" / "scheduler_config.json" if folder else None
        if config is None or not config.is_file():
            return None
        name = json.loads(config.read_text()).get("_class_name")
        cls = getattr(diffusers, str(name), None)
        if not (isinstance(cls, type) and issubclass(cls, diffusers.SchedulerMixin)):
            raise ValueError(f"{config} names _class_name={name!r}, which is not a diffusers scheduler")
        return cls.from_pretrained(str(Path(folder) / "scheduler"))

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

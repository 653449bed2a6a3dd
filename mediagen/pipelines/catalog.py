"""The shipped models: which checkpoint serves a (family, attention, text encoder), and what each one is.

``mediagen generate`` and the app resolve shipped models here and nowhere else, reading the folders under
``checkpoints_dir()`` (``MEDIAGEN_CHECKPOINTS``, default ``mediagen/checkpoints``) and their own card.json:

    image-<label>/         a class-conditional pipeline or transformer trained with that attention
    video-<label>/         a text-to-video pipeline or transformer (text-to-image: one frame of a clip)
    text-mlra/, text-hla/  the MLRA / HLA text encoders distilled from MiniLM

<label> is the attention's name (a pattern's label for a pattern: "hybrid" for wan-mhla-h;
``pipelines/names.py``). A family is served by its checkpoints only: an attention is on offer for a family
exactly when its ``<family>-<label>/`` folder exists (an untrained conversion of a trained model gives
blank outputs, so it is never offered silently); a family with no checkpoint at all (a checkout without
them) falls back to its preset with random weights.

card.json, every key optional:

    {
      "trained_steps": 40000,            optimizer steps (int)
      "clips_seen": 2560000,             training samples seen: clips for video, "images_seen" for images
      "images_seen": 1280000,
      "scores": {"digit_ok": 0.91,       name -> number, measured on this checkpoint as shipped
                 "direction_ok": 0.84},
      "measured_on": "512 clips, 20 steps, seed 0",   what the scores were measured on (one line)
      "note": "one line shown as is",
      "default_for": ["text-to-video"],  tasks this checkpoint serves when none is asked for
      "trained_on": {"digits": 1,        a video model's training prompts: digits per clip and the wording,
                     "wording": "the digit 3 moves left",   and the clip sizes it trained at (the largest one
                     "sizes": [{"frames": 16, "height": 64, "width": 64}]},   widens a CPU server's bounds)
      "default_size": {"frames": 32, "height": 128, "width": 128},   the size a video checkpoint draws at when
                                         none is asked (``default_size``); without it, its preset's size
      "caption_template": "the digit {d} moves {m}",   the one caption template a video model was trained on:
                                         prompts are rewritten to it by default (``prompts.rewrite_prompt``);
                                         its pipeline's model_index.json carries the same (with
                                         "caption_digits", the card's trained_on digits)
      "vs_minilm": [{"task": "text-to-video", "model": "video-mhla", "wordings": "template",
                     "clips": 40, "digit": 0.725, "minilm_digit": 0.85,
                     "measured_on": "..."}]   a text encoder's card: how often a model draws the asked digit
                                         through this encoder and through MiniLM, on the same clips
    }

The default for a task is the checkpoint of the task's family whose card lists the task in "default_for":
``mediagen generate`` without ``--model`` runs it and the app's tabs start on it. The choice is made where
the scores that justify it are, so it moves with them; with no card naming a task, the CLI takes the
family's preset and the app its first attention. The info line (``card_line``) is the card in one line,
"scores: not measured" without a card or without "scores"; ``card_details`` is the rest.

A text encoder is offered for a task only while every rate its card measures for that task ("vs_minilm") lies
within ``MINILM_MARGIN`` (3 points) of MiniLM's on the same clips: the video models were trained on MiniLM's
states, and an encoder that costs them the asked digit more often than that is not one to pick. A task its card
measures nothing for (text-to-image today) keeps the encoder. ``encoder_shortfall`` gives the measurement that
withholds it, for the app to say why.

Reads JSON files only: nothing here loads a model.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from ..models.attention_spec import attention_choices
from .names import CHECKPOINT_LABELS
from .shipping import checkpoints_dir


@dataclass(frozen=True)
class Family:
    """A kind of shipped model. tasks: what its checkpoints serve, the first being what they were trained
    for; preset: served (random weights, sdpa) when the family has no checkpoint; what: for the app's intro."""

    name: str
    tasks: tuple[str, ...]
    preset: str
    what: str


FAMILIES = {f.name: f for f in (
    Family("image", ("class-to-image",), "dit-mnist", "class-conditional digits"),
    Family("video", ("text-to-video", "text-to-image"), "wan-mmnist", "text-to-video, and text-to-image as one frame"),
)}

# The text encoders the video models can read prompts with, by the label the app shows: the load_text_encoder
# name, and the folder of the shipped encoder distilled from MiniLM that replaces it when present (undistilled,
# MiniLM's weights in MLRA / HLA layers give states the video models were not trained on).
TEXT_ENCODERS = {"FlashAttention": ("minilm", None), "MLRA": ("minilm-mlra2", "text-mlra"),
                 "HLA": ("minilm-hla", "text-hla")}

# Attentions are listed with the softmax baseline (every comparison's reference) first, then MHLA, then the
# others in the registry's order. Only the order is chosen here: the names come from the registry.
_SHOWN_FIRST = ("sdpa", "mhla")


def family(name: str) -> Family:
    if name not in FAMILIES:
        raise ValueError(f"model family {name!r} is not known: use one of {tuple(FAMILIES)}")
    return FAMILIES[name]


def family_for_task(task: str) -> Family:
    for fam in FAMILIES.values():
        if task in fam.tasks:
            return fam
    raise ValueError(f"task={task!r} is not allowed: use one of {[t for f in FAMILIES.values() for t in f.tasks]}")


def label_of(attention: str) -> str:
    """The folder label of an attention (``mediagen.convert`` name): its name, a pattern's own label."""
    return CHECKPOINT_LABELS.get(attention, attention)


def attention_labels() -> dict[str, str]:
    """label -> ``mediagen.convert`` name of every attention, in the order they are listed."""
    order = sorted(attention_choices(), key=lambda n: _SHOWN_FIRST.index(n) if n in _SHOWN_FIRST else len(_SHOWN_FIRST))
    return {label_of(name): name for name in order}


def _root(root) -> Path:
    return Path(root) if root is not None else checkpoints_dir()


def holds_model(folder: Path) -> bool:
    return (folder / "model_index.json").is_file() or (folder / "config.json").is_file()


def checkpoints(family_name: str, root=None) -> dict[str, Path]:
    """label -> folder of every checkpoint of the family, in ``attention_labels`` order."""
    family(family_name)
    root = _root(root)
    return {label: root / f"{family_name}-{label}" for label in attention_labels()
            if holds_model(root / f"{family_name}-{label}")}


def shipped_names(root=None) -> list[str]:
    """Every shipped checkpoint's name ("image-sdpa", ..., "video-mhla"), family by family, for messages."""
    return [f"{name}-{label}" for name in FAMILIES for label in checkpoints(name, root)]


def trained_attentions(family_name: str, root=None) -> list[str]:
    """``mediagen.convert`` names of the attentions the family has a checkpoint of."""
    names = attention_labels()
    return [names[label] for label in checkpoints(family_name, root)]


def checkpoint(family_name: str, attention: str, root=None) -> Path | None:
    """The folder serving (family, attention) (``attention``: a ``mediagen.convert`` name); None without one."""
    return checkpoints(family_name, root).get(label_of(attention))


def family_of(name: str, root=None) -> str | None:
    """"video" for the name of a shipped checkpoint such as "video-mhla"; None for anything else."""
    prefix, _, label = str(name).partition("-")
    return prefix if prefix in FAMILIES and label in checkpoints(prefix, root) else None


def default_label(task: str, root=None) -> str | None:
    """The label of the checkpoint whose card names ``task`` in "default_for" (module docstring); None when
    no card does. Two cards of one family naming the same task are an error in the cards."""
    fam = family_for_task(task)
    chosen = [label for label, folder in checkpoints(fam.name, root).items() if task in _default_for(folder)]
    if len(chosen) > 1:
        raise ValueError(f"checkpoints {[f'{fam.name}-{c}' for c in chosen]} all name {task!r} in their card.json "
                         f"default_for: keep it on one card")
    return chosen[0] if chosen else None


def _default_for(folder: Path) -> tuple[str, ...]:
    """The tasks a card names in "default_for" (a list; a single task as a string is taken too)."""
    value = read_card(folder).get("default_for")
    value = [value] if isinstance(value, str) else value
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()


def default_checkpoint(task: str, root=None) -> str | None:
    """The name of the default checkpoint for ``task`` ("video-mhla"), None when no card names the task."""
    label = default_label(task, root)
    return None if label is None else f"{family_for_task(task).name}-{label}"


SIZE_KEYS = ("frames", "height", "width")


def card_size(card: dict) -> dict | None:
    """A card's "default_size" as {"frames", "height", "width"} of positive ints; None when the card has none.
    A malformed one is an error naming the value and what is allowed (a card is the project's own file)."""
    value = card.get("default_size")
    if value is None:
        return None
    if (not isinstance(value, dict) or set(value) != set(SIZE_KEYS)
            or not all(type(value[k]) is int and value[k] > 0 for k in SIZE_KEYS)):
        raise ValueError(f"card.json default_size={value!r} is not allowed: use {{\"frames\": F, \"height\": H, "
                         f"\"width\": W}} with positive integers")
    return {k: value[k] for k in SIZE_KEYS}


def default_size(family_name: str, root=None) -> dict | None:
    """The size the family's default checkpoint (for its first task) draws at when none is asked: its card's
    "default_size"; None without a default checkpoint or without the key (the preset's size applies)."""
    label = default_label(family(family_name).tasks[0], root)
    return None if label is None else card_size(read_card(checkpoints(family_name, root)[label]))


def largest_trained_size(family_name: str, root=None) -> dict | None:
    """The largest clip (in pixels x frames) any checkpoint of the family trained at, from the cards'
    "trained_on" "sizes": the size a server must allow for every trained size to be asked for. None when no card
    lists sizes. Entries that are not three positive integers are skipped (``size_note`` lists what is there)."""
    sizes = []
    for folder in checkpoints(family_name, root).values():
        trained = read_card(folder).get("trained_on")
        for size in (trained.get("sizes") or []) if isinstance(trained, dict) else []:
            if isinstance(size, dict) and all(type(size.get(k)) is int and size[k] > 0 for k in SIZE_KEYS):
                sizes.append({k: size[k] for k in SIZE_KEYS})
    return max(sizes, key=lambda s: (s["frames"] * s["height"] * s["width"], s["height"]), default=None)


def defaults(family_name: str, root=None) -> dict[str, str]:
    """task -> label of the family's default checkpoint for it, for the tasks a card names."""
    out = {task: default_label(task, root) for task in family(family_name).tasks}
    return {task: label for task, label in out.items() if label is not None}


def text_encoders(root=None) -> dict[str, str]:
    """label -> what ``load_text_encoder`` loads for it: the shipped distilled folder when there is one."""
    root = _root(root)
    return {label: str(root / folder) if folder and (root / folder / "config.json").is_file() else name
            for label, (name, folder) in TEXT_ENCODERS.items()}


# A text encoder is offered for a task only within this of MiniLM's rate of drawing the asked digit (module
# docstring): one clip of 40 is 2.5 points, so an encoder one clip behind MiniLM stays on offer.
MINILM_MARGIN = 0.03


def caption_template(card: dict) -> str | None:
    """The caption template a card declares ("the digit {d} moves {m}"): the model wants its prompts rewritten
    to it. None without one (a model trained on free wording, or no card)."""
    value = card.get("caption_template")
    return value if isinstance(value, str) and value else None


def encoder_card(name) -> dict:
    """The card of the text encoder ``load_text_encoder`` loads for ``name`` (``text_encoders``' values): a shipped
    folder's card.json; {} for a name that is not a folder (MiniLM, the undistilled encoders)."""
    return read_card(name) if (Path(name) / "config.json").is_file() else {}


def encoder_rates(card: dict, task: str) -> list[dict]:
    """The card's "vs_minilm" measurements for ``task`` that hold both rates as numbers."""
    rows = card.get("vs_minilm")
    if not isinstance(rows, list):
        return []

    def rate(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

    return [r for r in rows if isinstance(r, dict) and r.get("task") == task and rate(r.get("digit"))
            and rate(r.get("minilm_digit"))]


def encoder_shortfall(card: dict, task: str) -> dict | None:
    """The first measurement for ``task`` in which the encoder draws the asked digit more than ``MINILM_MARGIN``
    less often than MiniLM (the encoder is then not offered for the task); None when it keeps up or nothing is
    measured. Rounded so that a rate exactly 3 points below counts as within."""
    for row in encoder_rates(card, task):
        if round(row["minilm_digit"] - row["digit"], 9) > MINILM_MARGIN:
            return row
    return None


# --- cards -------------------------------------------------------------------------------------------------

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


def card_line(card: dict) -> str:
    """What a model card says in one line: "11,223 training steps; digit 0.965, direction 1.0"."""
    if "error" in card:
        return f"trained; {card['error']}; scores: not measured"
    steps = (f"{_count(card['trained_steps'])} training steps" if "trained_steps" in card
             else "trained (steps not recorded)")
    scores = card.get("scores")
    if isinstance(scores, dict) and scores:
        return f"{steps}; " + ", ".join(f"{k} {_score(v)}" for k, v in scores.items())
    return f"{steps}; scores: not measured"


def card_details(card: dict) -> str:
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

"""Moving-MNIST captions in many wordings, and a fixed set of wordings held out of training.

The shipped video models were trained on one wording, "the digit 3 moves left" (``clip_caption``); with
other wordings a person would type they draw the asked digit far less often, while the direction survives.
Training on varied wordings teaches the model to read the digit and the direction whatever the phrasing.

``varied_caption(digits, directions, rng)`` draws one wording: word order (subject first, direction
first, a noun phrase), synonyms of the motion ("moves", "slides", "drifts", "goes", "is heading", ...),
direction phrases ("left", "to the left", "leftwards", ...), the digit as a numeral or a number word,
with or without "the digit", short and long, lower, sentence, title or upper case, and a little noise
("a handwritten 3", "on a black background"). Two digits join two clauses ("the digit 3 moves left
while the digit 8 moves down"), or one clause when they share a direction ("the digits 3 and 8 move
left"); still clips are named without a direction ("a handwritten 3").

Every wording keeps the rule ``mediagen.eval.moving_mnist.parse_prompt`` reads prompts by: a direction
word applies to the digits named since the previous direction word, and digits after the last one take
the last one. So a direction phrase put before its digit ("to the left slides the 3") comes only in a
caption's last clause, and no extra word is a number or a direction.

``HELD_OUT`` holds wordings the training generator never produces, for scoring how far a model
generalises: each of them uses a word or mark (``HELD_OUT_MARKERS``) that no training wording contains.

``VariedCaptions`` re-captions a ``MovingMNISTDataset``: clip ``i`` keeps its pixels and gets a varied
wording with probability ``share`` (``data.varied_captions``), drawn from a generator of its own, so the
clips themselves and the template captions of the other clips are unchanged.
"""

from __future__ import annotations

import numpy as np
from torch.utils.data import Dataset

NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
STILL = "still"  # the motion name of a clip whose digits stand still (as in ``moving_mnist``)

# direction phrases; "to the up" is not English, so up and down have fewer forms
DIRECTION_PHRASES = {
    "left": ("left", "to the left", "leftward", "leftwards", "towards the left", "toward the left"),
    "right": ("right", "to the right", "rightward", "rightwards", "towards the right", "toward the right"),
    "up": ("up", "upward", "upwards", "straight up"),
    "down": ("down", "downward", "downwards", "straight down"),
}
# (third person singular, plural, participle); "goes left" reads as well as "moves left"
VERBS = (("moves", "move", "moving"), ("slides", "slide", "sliding"), ("drifts", "drift", "drifting"),
         ("goes", "go", "going"), ("heads", "head", "heading"), ("floats", "float", "floating"),
         ("scrolls", "scroll", "scrolling"), ("is moving", "are moving", "moving"),
         ("is heading", "are heading", "heading"), ("is sliding", "are sliding", "sliding"))
# how one digit is named; {n} is "3" or "three"
SUBJECTS = ("the digit {n}", "the digit {n}", "digit {n}", "the number {n}", "number {n}", "a {n}", "the {n}",
            "{n}", "a handwritten {n}", "the handwritten digit {n}", "a handwritten digit {n}")
# two digits sharing a direction; {a}, {b} are the digits' names
PLURAL_SUBJECTS = ("the digits {a} and {b}", "digits {a} and {b}", "the numbers {a} and {b}", "{a} and {b}",
                   "a {a} and a {b}", "the {a} and the {b}")
SUFFIXES = ("on a black background", "in a short clip", "slowly", "smoothly", "steadily", "at a steady pace",
            "on black")
PREFIXES = ("video:", "clip:", "a video:", "mnist:")              # read before any clause
STILL_PREFIXES = ("a picture of", "an image of", "a video of")
STILL_SUFFIXES = ("standing still", "at rest", "not moving", "on a black background")
CONNECTORS = (" while ", " and ", ", ", ", and ", ", while ")

# Held out of training: fixed wordings, each with a word or mark of HELD_OUT_MARKERS. {d} a numeral,
# {w} a number word, {m} a direction word ("left"); the "ward" form is made from {m}.
HELD_OUT = {
    "one": ("watch the digit {d} travel {m}",
            "{W} glides {m}",
            "a handwritten {d} that travels {m} across the frame",
            "can you make the number {d} go {m}?",
            "the {d} keeps shifting {m}",
            "{m}ward motion of the digit {d}",
            "number {w}, travelling {m}",
            "{d} glides {m} across a dark screen"),
    "two": ("watch the digit {d} travel {m} as the digit {d2} travels {m2}",
            "{W} glides {m}; {w2} glides {m2}",
            "can you make the {d} go {m} and the {d2} go {m2}?",
            "the number {d} shifting {m}, the number {d2} shifting {m2}"),
    STILL: ("watch the digit {d}",
            "the number {w} on a dark screen",
            "can you make the {d}?"),
}
HELD_OUT_MARKERS = ("watch", "travel", "travels", "travelling", "glides", "across", "can", "make", "keeps",
                    "shifting", "motion", "dark", "screen", "as", "?", ";")


def _name(d: int, words: bool) -> str:
    return NUMBER_WORDS[d] if words else str(d)


def _articles(text: str) -> str:
    """"a 8" / "a eight" -> "an 8" / "an eight" (the only vowel sounds a digit's name starts with)."""
    words = text.split(" ")
    for i in range(len(words) - 1):
        if words[i].lower() == "a" and (words[i + 1].startswith(("8", "eight"))):
            words[i] = words[i][0] + "n"
    return " ".join(words)


def _pick(rng, options):
    return options[int(rng.integers(len(options)))]


def _subject(d: int, rng, words: bool) -> str:
    return _pick(rng, SUBJECTS).format(n=_name(d, words))


def _clause(d: int, direction: str, rng, words: bool, last: bool) -> str:
    """One digit and its motion. A direction phrase may come first only in the last clause (then no
    digit follows that would take it by ``parse_prompt``'s rule)."""
    subject, phrase = _subject(d, rng, words), _pick(rng, DIRECTION_PHRASES[direction])
    finite, _, participle = _pick(rng, VERBS)
    order = rng.random()
    if order < 0.55:
        return f"{subject} {finite} {phrase}"                         # the digit 3 slides to the left
    if order < 0.8:
        return f"{subject} {participle} {phrase}"                     # a 3 drifting left
    if order < 0.9:
        return f"{subject}, {participle} {phrase}"                    # digit three, heading upwards
    if last and " " not in finite:
        return f"{phrase} {finite} {subject}"                         # to the left slides the 3
    return f"{subject} {finite} {phrase}"


def _case(text: str, rng) -> str:
    pick = rng.random()
    if pick < 0.7:
        return text
    if pick < 0.85:
        return text[0].upper() + text[1:]                              # The digit 3 moves left
    if pick < 0.95:
        return " ".join(w[0].upper() + w[1:] for w in text.split(" "))  # The Digit 3 Moves Left
    return text.upper()


def varied_caption(digits, directions, rng: np.random.Generator) -> str:
    """A caption naming ``digits`` (ints 0-9) and their ``directions`` ("left", "right", "up", "down",
    or "still" for every digit of a still clip), in a wording drawn with ``rng``."""
    digits, directions = [int(d) for d in digits], list(directions)
    if len(digits) != len(directions) or not digits:
        raise ValueError(f"digits={digits} and directions={directions} must be non-empty and of one length")
    words = rng.random() < 0.35                                       # "three" rather than "3", for the caption
    if all(m == STILL for m in directions):
        text = " and ".join(_subject(d, rng, words) for d in digits)
        noise = rng.random()
        if noise < 0.2:
            text = f"{_pick(rng, STILL_PREFIXES)} {text}"
        elif noise < 0.4:
            text = f"{text} {_pick(rng, STILL_SUFFIXES)}"
    else:
        unknown = [m for m in directions if m not in DIRECTION_PHRASES]
        if unknown:
            raise ValueError(f"directions={directions} is not allowed: use {list(DIRECTION_PHRASES)} (or all "
                             f"{STILL!r})")
        if len(digits) > 1 and len(set(directions)) == 1 and rng.random() < 0.5:
            names = [_name(d, words) for d in digits]
            subject = _pick(rng, PLURAL_SUBJECTS).format(a=", ".join(names[:-1]), b=names[-1])
            _, plural, _ = _pick(rng, VERBS)
            both = " both" if len(digits) == 2 and rng.random() < 0.4 else ""
            text = f"{subject}{both} {plural} {_pick(rng, DIRECTION_PHRASES[directions[0]])}"
        else:
            clauses = [_clause(d, m, rng, words, last=i == len(digits) - 1)
                       for i, (d, m) in enumerate(zip(digits, directions))]
            text = clauses[0]
            for clause in clauses[1:]:
                text += _pick(rng, CONNECTORS) + clause
        noise = rng.random()
        if noise < 0.12:
            text = f"{_pick(rng, PREFIXES)} {text}"
        elif noise < 0.35:
            text = f"{text} {_pick(rng, SUFFIXES)}"
    text = _case(_articles(text), rng)
    return text + "." if rng.random() < 0.15 else text


def held_out_caption(digits, directions, template: int) -> str:
    """The held-out wording number ``template`` of ``HELD_OUT["one"]`` (one digit), ``["two"]`` (two
    digits) or ``[STILL]`` (still clips) for ``digits`` and ``directions``."""
    digits, directions = [int(d) for d in digits], list(directions)
    kind = STILL if all(m == STILL for m in directions) else {1: "one", 2: "two"}.get(len(digits))
    if kind is None:
        raise ValueError(f"digits={digits}: held-out wordings name one or two moving digits, or still ones")
    if kind == STILL and len(digits) != 1:
        raise ValueError(f"digits={digits}: held-out wordings of still clips name one digit")
    forms = HELD_OUT[kind]
    d, m = digits[0], directions[0]
    fields = {"d": d, "w": NUMBER_WORDS[d], "W": NUMBER_WORDS[d].capitalize(), "m": m}
    if kind == "two":
        fields.update(d2=digits[1], w2=NUMBER_WORDS[digits[1]], m2=directions[1])
    return forms[template % len(forms)].format(**fields)


def held_out_grid(directions=("left", "right", "up", "down")) -> tuple[list[str], list[int], list[str]]:
    """Every one-digit held-out wording for every digit and direction: (captions, digits, directions),
    digits x directions x wordings in that order (320 captions)."""
    captions, ds, ms = [], [], []
    for d in range(10):
        for m in directions:
            for t in range(len(HELD_OUT["one"])):
                captions.append(held_out_caption([d], [m], t))
                ds.append(d)
                ms.append(m)
    return captions, ds, ms


def caption_corpus(count: int, seed: int = 0, two_digits: float = 0.5, still: float = 0.1,
                   held_out: bool = False) -> list[str]:
    """``count`` captions of random digits and directions: a share ``still`` of still clips, of the rest
    a share ``two_digits`` with two digits. Varied training wordings, or with ``held_out`` the held-out
    wordings (each drawn uniformly). Deterministic given ``seed``."""
    rng = np.random.default_rng([seed, 0x5eed])
    names = list(DIRECTION_PHRASES)
    out = []
    for _ in range(count):
        if rng.random() < still:
            n = 1 if held_out else 1 + int(rng.random() < two_digits)
            digits, directions = [int(x) for x in rng.integers(10, size=n)], [STILL] * n
        else:
            n = 1 + int(rng.random() < two_digits)
            digits = [int(x) for x in rng.integers(10, size=n)]
            directions = [names[int(k)] for k in rng.integers(4, size=n)]
        if held_out:
            kind = STILL if directions[0] == STILL else ("one" if n == 1 else "two")
            out.append(held_out_caption(digits, directions, int(rng.integers(len(HELD_OUT[kind])))))
        else:
            out.append(varied_caption(digits, directions, rng))
    return out


class VariedCaptions(Dataset):
    """A ``MovingMNISTDataset`` whose clip ``i`` is captioned in a varied wording with probability
    ``share``, else keeps its template caption (kept too as ``template_caption``, which a teacher reads with
    ``finetune.teacher_caption=template``). The choice and the wording come from a generator seeded
    with (seed, i, 2), apart from the generators of the clip's content (``plan``) and its stillness, so
    the pixels do not change and a resumed run sees the same captions.

    Varied captions are too many to precompute (``data.cache_dir``): ``all_captions`` still lists the
    template ones, and a batch holding any other caption is encoded as it comes."""

    def __init__(self, dataset, share: float, seed: int = 0):
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"data.varied_captions={share} is not allowed: use a number in [0, 1]")
        self.dataset, self.share, self.seed = dataset, share, seed

    def __len__(self) -> int:
        return len(self.dataset)

    def __getattr__(self, name):                                      # plan, render, all_captions, ...
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def caption(self, i: int, template: str) -> str:
        rng = np.random.default_rng([self.seed, int(i), 2])
        if rng.random() >= self.share:
            return template
        ks, directions = self.dataset.plan(int(i))[:2]
        return varied_caption([int(self.dataset.labels[k]) for k in ks], directions, rng)

    def __getitem__(self, i: int) -> dict:
        item = dict(self.dataset[i])
        item["template_caption"] = item["caption"]
        item["caption"] = self.caption(i, item["caption"])
        return item

    def render_batch(self, indices, device) -> dict:
        batch = self.dataset.render_batch(indices, device)
        batch["template_caption"] = batch["caption"]
        batch["caption"] = [self.caption(int(i), c) for i, c in zip(indices, batch["caption"])]
        return batch

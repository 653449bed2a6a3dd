"""The Moving-MNIST caption language: the template the shipped video models were trained on, and the parser
that reads a prompt's digits and directions.

``template_caption`` renders the training template ("the digit 3 moves left", "the digit 3 moves left while
the digit 8 moves down"; a still clip is named without a motion: "the digit 3"). The training data captions
every clip with it (``mediagen.training.data.moving_mnist.clip_caption``), and prompt rewriting
(``mediagen.pipelines.prompts``) renders a prompt in it, so the two cannot drift apart.

``parse_prompt`` reads the digits (numerals or number words), their directions and the digit count a
prompt asks for. The clip scorer (``mediagen.eval.moving_mnist``), the app's notes and prompt rewriting all
read prompts with it. A direction word applies to the digits named since the previous direction word, and
digits after the last one take the last one. Directions are read from "left", "leftward(s)" and the like, compass
points ("west"), verbs of rising and falling ("falling", "ascends"), and the canvas's edges after "to" / "toward(s)"
("toward the top"); after "from" and before "to <direction>" they name where a digit starts ("from right to
left", "right-to-left").

Standard library only: the pipelines read prompts with it, and the scorer and the training data build on it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

STILL = "still"  # the motion name of a clip whose digits stand still
CAPTION_TEMPLATE = "the digit {d} moves {m}"  # the training template of one moving digit, as cards name it
# Numbers above 9 a prompt may name in words; a numeral of two or more digits is one too ("12"). The parser
# reads "12" as the digits 1 and 2, so a prompt naming such a number is not read as digits at all.
BIG_NUMBER_WORDS = frozenset((
    "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen",
    "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety", "hundred", "thousand", "million",
    "dozen"))


def template_caption(digits, directions) -> str:
    """The training template for ``digits`` and their ``directions`` ("left", "right", "up", "down", or
    ``STILL`` for every digit of a still clip): "the digit 3 moves left while the digit 8 moves down", or
    "the digit 3 and the digit 8" for a still clip."""
    if all(m == STILL for m in directions):  # a caption without a direction: "the digit 3"
        return " and ".join(f"the digit {d}" for d in digits)
    return " while ".join(f"the digit {d} moves {m}" for d, m in zip(digits, directions))


def big_numbers(prompt: str) -> list[str]:
    """The numbers above 9 a prompt names, as written ("12", "twenty")."""
    words = re.findall(r"[a-z]+|\d+", prompt.lower())
    return [w for w in words if (w.isdigit() and int(w) > 9) or w in BIG_NUMBER_WORDS]


NUMBER_WORDS = {"zero": 0, "nought": 0, "naught": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
                "seven": 7, "eight": 8, "nine": 9}
COUNT_WORDS = {"a": 1, "an": 1, "one": 1, "single": 1, "two": 2, "three": 3, "four": 4, "five": 5}
DIRECTIONS = {"left": "left", "leftward": "left", "leftwards": "left", "right": "right", "rightward": "right",
              "rightwards": "right", "up": "up", "upward": "up", "upwards": "up", "down": "down",
              "downward": "down", "downwards": "down"}
# words that name a direction by a compass point or a verb of rising or falling ("a six travelling west",
# "an eight falling", "9 ascending")
DIRECTIONS.update({w: "left" for w in ("west", "westward", "westwards")})
DIRECTIONS.update({w: "right" for w in ("east", "eastward", "eastwards")})
DIRECTIONS.update({w: "up" for w in ("north", "northward", "northwards", "rise", "rises", "rising", "ascend",
                                      "ascends", "ascending", "climb", "climbs", "climbing", "soar", "soars",
                                      "soaring")})
DIRECTIONS.update({w: "down" for w in ("south", "southward", "southwards", "fall", "falls", "falling", "drop",
                                        "drops", "dropping", "descend", "descends", "descending", "sink", "sinks",
                                        "sinking", "plummet", "plummets", "plummeting", "plunge", "plunges",
                                        "plunging", "dive", "dives", "diving")})
# the canvas's edges, a direction only after "to"/"toward(s)"/"from" ("toward the top", "from top to bottom")
EDGES = {"top": "up", "bottom": "down"}
OPPOSITE = {"left": "right", "right": "left", "up": "down", "down": "up"}
WAY_WORDS = frozenset(DIRECTIONS) | frozenset(EDGES)


@dataclass
class DigitPrompt:
    digits: list[int]
    directions: list[str | None]  # one per digit
    count: int | None

    @property
    def direction(self) -> str | None:
        """The shared direction when every digit has the same one, else None."""
        uniq = set(self.directions)
        return self.directions[0] if len(uniq) == 1 else None


def _direction(words: list[str], i: int) -> str | None:
    """The direction the word ``words[i]`` names, if any. A direction or edge followed by "to <direction>"
    names where the digit starts, not the way ("right to left": none, then left); one after "from" does too, so
    it names the opposite way when nothing follows ("sliding in from the left": right)."""
    w = words[i]
    j = i - 1 - (i >= 1 and words[i - 1] == "the")   # the word before, "the" skipped
    prev = words[j] if j >= 0 else ""
    if w in EDGES:
        way = EDGES[w]
    elif w in DIRECTIONS:
        way = DIRECTIONS[w]
    else:
        return None
    k = i + 2 + (i + 2 < len(words) and words[i + 2] == "the")   # "right to (the) left": right is where it starts
    if i + 1 < len(words) and words[i + 1] == "to" and k < len(words) and words[k] in WAY_WORDS:
        return None
    if prev == "from":
        return OPPOSITE[way]
    if w in EDGES and prev not in ("to", "toward", "towards"):
        return None   # "the 3 at the top" says where, not which way
    return way


def parse_prompt(prompt: str) -> DigitPrompt | None:
    """The digits, direction and count a Moving-MNIST prompt asks for; None for other prompts."""
    words = re.findall(r"[a-z]+|\d", prompt.lower())
    count = None
    for w, nxt in zip(words, words[1:]):
        if w in COUNT_WORDS and (nxt in ("digit", "digits") or (w in NUMBER_WORDS and nxt.isdigit())):
            count = COUNT_WORDS[w]   # "two digits", and "one 7": a count before a numeral
    digits, directions, pending = [], [], 0  # pending: digits still waiting for their direction
    last = None
    for i, w in enumerate(words):
        nxt = words[i + 1] if i + 1 < len(words) else ""
        if w.isdigit():
            digits.append(int(w))
            pending += 1
        elif w in NUMBER_WORDS and not (w in COUNT_WORDS and (nxt in ("digit", "digits") or nxt.isdigit())):
            digits.append(NUMBER_WORDS[w])
            pending += 1
        elif (way := _direction(words, i)) is not None:
            last = way
            directions += [last] * pending
            pending = 0
    directions += [last] * pending
    if not digits:
        return None
    return DigitPrompt(digits, directions, count if count is not None else len(digits))

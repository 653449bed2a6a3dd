"""What the video models understand in a prompt: the Video tab's help text and the prompt a model is given
when it gets prompts rewritten to its caption template (``read_as``); the notes beside an output whose prompt
or size the models cannot read are ``mediagen.pipelines.prompts.prompt_note`` / ``size_note``, which
`mediagen generate` prints too.

Prompts are read as the clip scorer reads them (``mediagen.data.captions.parse_prompt``, which reads every
wording of ``mediagen.training.data.wordings``): digits 0–9 as numerals or number words ("7", "seven"), each
moving the way of the direction word (left, right, up, down) after it; the Moving-MNIST data draws one or two
digits a clip. What a shipped model was trained on is its card's "trained_on" (digits per clip, the wording).

A prompt the models cannot read gets a note rather than silence: one that names no digit, a number above 9
(a numeral of two or more digits, "ten" ... "ninety", "hundred"; the parser would read "12" as the digits 1
and 2), more than two digits, or more digits than the model's training clips held.

A model whose card declares a "caption_template" (the shipped video models: "the digit {d} moves {m}") gets
the prompt rewritten to it unless the user turns that off (``mediagen.pipelines.prompts.rewrite_prompt``):
with other wordings it draws the asked digit far less often. The page shows what the model was given,
"read as: the digit 3 moves left", beside the clip.
"""

from __future__ import annotations

from ..pipelines.prompts import LEFT_AS_WRITTEN, rewrite_prompt

_COUNT = {1: "one digit", 2: "two digits"}


def help_text(trained: dict[str, dict]) -> str:
    """The Video tab's prompt help: what the models read, and what the served models were trained on
    (``trained``: model name -> its card's "trained_on"; models without one are left out)."""
    text = ("The models read the digits 0–9 (\"7\" or \"seven\") and the directions left, right, up and down, for "
            "one digit or two (\"the digit 3 moves left while the digit 8 moves down\").")
    groups: dict[tuple, list[str]] = {}
    for name, what in trained.items():
        digits = what.get("digits") if isinstance(what, dict) else None
        if isinstance(digits, int) and not isinstance(digits, bool):
            groups.setdefault((digits, what.get("wording"), _sizes_text(what.get("sizes"))), []).append(name)
    for (digits, wording, sizes), names in groups.items():
        model = ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else names[0]
        verb = "are" if len(names) > 1 else "is"
        worded = f", worded \"{wording}\"" if isinstance(wording, str) and wording else ""
        at = f", at {sizes}" if sizes else ""
        text += f" {model} {verb} trained on {_COUNT.get(digits, f'{digits} digits')} a clip{worded}{at}."
    return text


def _sizes_text(sizes) -> str:
    """A card's trained sizes as words: "16 frames of 64×64 and 32 frames of 128×128"; "" without any."""
    listed = [f"{s['frames']} frames of {s['height']}×{s['width']}" for s in sizes or ()
              if isinstance(s, dict) and all(isinstance(s.get(k), int) for k in ("frames", "height", "width"))]
    return ", ".join(listed[:-1]) + f" and {listed[-1]}" if len(listed) > 1 else "".join(listed)


def read_as(prompt: str, template: str | None, trained_on: dict | None = None, rewrite: bool = True) -> tuple[str, str]:
    """(the prompt the model is given, the line shown beside its output): ``prompt`` rendered in ``template``
    (a card's "caption_template") with "read as: <it>", when ``rewrite`` is on and the model has a template and
    the prompt could be read; else the prompt as written and "" (``prompt_note`` says what could not be read).
    ``trained_on``: the card's "trained_on", whose "digits" caps the digits a rewritten prompt may name."""
    if not rewrite or template is None:
        return prompt, ""
    digits = trained_on.get("digits") if isinstance(trained_on, dict) else None
    digits = digits if isinstance(digits, int) and not isinstance(digits, bool) else None
    used, why = rewrite_prompt(prompt, template, digits)
    return used, ("" if why.startswith(LEFT_AS_WRITTEN) else f"read as: {used}")



"""What the video models understand in a prompt: the Video tab's help text, the note beside a clip whose
prompt they cannot read, and the prompt a model is given when it gets prompts rewritten to its caption
template (``read_as``).

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

from ..data.captions import big_numbers, parse_prompt
from ..pipelines.prompts import LEFT_AS_WRITTEN, MAX_DIGITS, rewrite_prompt

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


def prompt_note(prompt, model: str | None = None, trained_on: dict | None = None, still: bool = False) -> str:
    """One line saying what the models cannot read in ``prompt``, "" when they read all of it. ``model`` /
    ``trained_on``: the model drawing the clip and its card's "trained_on", for a prompt naming more digits
    than its training clips held. ``still``: the prompt is for a still (one frame), where no direction is asked."""
    prompt = prompt if isinstance(prompt, str) else ""
    big = big_numbers(prompt)
    if big:
        them = "it" if len(big) == 1 else "them"
        return (f"The models cannot read {', '.join(big)} in this prompt: they know the digits 0–9 only, so the clip "
                f"does not follow {them}.")
    parsed = parse_prompt(prompt)
    if parsed is None:
        return ("The models cannot read this prompt: it names no digit. They draw the digits 0–9, named as \"7\" or "
                "\"seven\" (\"the digit 7 moves left\"), so this clip shows no asked digit.")
    named = len(parsed.digits)
    digits = ", ".join(str(d) for d in parsed.digits)
    if named > MAX_DIGITS:
        return (f"The models cannot read this prompt: it names {named} digits ({digits}) and they draw one or two "
                "a clip, so the clip does not show them all.")
    trained = trained_on.get("digits") if isinstance(trained_on, dict) else None
    if isinstance(trained, int) and not isinstance(trained, bool) and named > trained:
        return (f"This prompt names {named} digits ({digits}): {model or 'this model'} is trained on "
                f"{_COUNT.get(trained, f'{trained} digits')} a clip, so the clip may not show them all.")
    standing = [] if still else [str(d) for d, way in zip(parsed.digits, parsed.directions) if way is None]
    if standing:
        # the models trained on clips captioned without a direction as still clips
        return (f"This prompt names no direction the models know (left, right, up or down) for the digit "
                f"{' and '.join(standing)}, so it stands still in the clip.")
    return ""


def size_note(model: str | None, trained_on: dict | None, frames: int, height: int, width: int) -> str:
    """A note for a clip asked at a size the model never trained at (its card's "trained_on" "sizes", each
    frames x height x width); "" at a trained size or when the card names none. Such clips are outside what
    the model learned: the 1,024-token models drew no moving digit at 32x128x128 (docs/RESULTS.md, Long clips)."""
    sizes = trained_on.get("sizes") if isinstance(trained_on, dict) else None
    if not sizes:
        return ""
    trained = [(s.get("frames"), s.get("height"), s.get("width")) for s in sizes if isinstance(s, dict)]
    if (frames, height, width) in trained:
        return ""
    listed = ", ".join(f"{f} frames of {h}×{w}" for f, h, w in trained)
    return (f"{model or 'This model'} was trained on {listed}; a clip of {frames} frames of {height}×{width} is "
            f"outside what it learned and may not show the asked digit or motion.")

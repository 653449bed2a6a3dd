"""Prompt rewriting: a prompt in any wording, rendered in the caption template a model was trained on.

The shipped video models were trained on one template ("the digit 3 moves left"); other wordings a person
would type ("watch the digit three travel left") get the asked digit drawn far less often, while the
direction survives (docs/RESULTS.md, "Caption wordings"). Until a model is trained on varied wordings,
the remedy is to read the prompt's digits and directions with the parser the clip scorer uses
(``mediagen.data.captions.parse_prompt``) and render them with the function that captions the training
data (``template_caption``): "watch the digit three travel left" -> "the digit 3 moves left", "a seven"
-> "the digit 7" (the still form). The rewritten prompt is shown to the user, and the rewriting can be
turned off.

A model wants it when its card names its template ("caption_template"; ``catalog.caption_template``) and
its pipeline carries the same in its config (``TextToVideoPipeline(caption_template=...,
caption_digits=...)``, saved in model_index.json). ``rewrite_prompt`` leaves a prompt unchanged when
the parser cannot read it faithfully: no digit, a number above 9, more digits than the model was trained
on, a count that disagrees with the digits named ("two digits moving left"), or a mix of still and
moving digits.
"""

from __future__ import annotations

from ..data.captions import CAPTION_TEMPLATE, STILL, big_numbers, parse_prompt, template_caption

MAX_DIGITS = 2   # the Moving-MNIST data draws one or two digits a clip (``num_digits``)
# the caption templates rewriting renders: the template as a card names it -> the function that renders it
TEMPLATES = {CAPTION_TEMPLATE: template_caption}
_COUNT = {1: "one digit", 2: "two digits"}
LEFT_AS_WRITTEN = "left as written"   # how every reason for leaving a prompt unchanged starts


def renderer(template: str):
    """The function rendering ``template`` (a card's "caption_template"); refused for an unknown one."""
    if template not in TEMPLATES:
        raise ValueError(f"caption_template={template!r} is not a template this package renders: use one of "
                         f"{list(TEMPLATES)} (or none, to leave prompts as written)")
    return TEMPLATES[template]


def rewrite_prompt(prompt: str, template: str = CAPTION_TEMPLATE, max_digits: int | None = None) -> tuple[str, str]:
    """(``prompt`` in ``template``, why): the rewritten prompt and "read as: <it>", or the prompt unchanged
    and why it was left so. ``max_digits``: the most digits a clip held in the model's training (None: the
    data's ``MAX_DIGITS``); a prompt naming more is left as written."""
    render = renderer(template)
    prompt = prompt if isinstance(prompt, str) else ""
    big = big_numbers(prompt)
    if big:
        return prompt, f"{LEFT_AS_WRITTEN}: it names {', '.join(big)}, and the models read the digits 0-9 only"
    parsed = parse_prompt(prompt)
    if parsed is None:
        return prompt, f"{LEFT_AS_WRITTEN}: it names no digit"
    named, most = len(parsed.digits), MAX_DIGITS if max_digits is None else min(max_digits, MAX_DIGITS)
    if named > most:
        return prompt, (f"{LEFT_AS_WRITTEN}: it names {named} digits, and the model was trained on "
                        f"{_COUNT.get(most, f'{most} digits')} a clip")
    if parsed.count != named:
        return prompt, f"{LEFT_AS_WRITTEN}: it asks for {parsed.count} digits and names {named}"
    moving = [m is not None for m in parsed.directions]
    if any(moving) and not all(moving):
        return prompt, f"{LEFT_AS_WRITTEN}: some of its digits have a direction and some have none"
    rewritten = render(parsed.digits, [m or STILL for m in parsed.directions])
    if rewritten == prompt:
        return prompt, "as written: already the model's caption template"
    return rewritten, f"read as: {rewritten}"


def rewrite_prompts(prompts, template: str, max_digits: int | None = None) -> list[str]:
    """``rewrite_prompt`` over a list, the rewritten prompts only."""
    return [rewrite_prompt(p, template, max_digits)[0] for p in prompts]


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

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

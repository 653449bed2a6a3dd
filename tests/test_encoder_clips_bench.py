"""benchmarks/encoder_clips: its prompts name every digit and direction once, in the template or in held-out
wordings the app's parser still reads; an unknown encoder is refused before anything is sampled."""

import pytest

from benchmarks.encoder_clips import main, prompts_for
from mediagen.eval.moving_mnist import parse_prompt


def test_prompts_cover_every_digit_and_direction_in_both_wordings():
    template, held = prompts_for("template"), prompts_for("held-out")
    assert len(template) == len(held) == 40 and not set(template) & set(held)
    assert template[0] == "the digit 0 moves left"
    for prompts in (template, held):
        asked = [(parse_prompt(p).digits, parse_prompt(p).direction) for p in prompts]
        assert asked == [([d], m) for d in range(10) for m in ("left", "right", "up", "down")]


def test_an_unknown_encoder_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["--encoders", "no-such-encoder"])
    assert "--encoders ['no-such-encoder'] are not allowed" in capsys.readouterr().err

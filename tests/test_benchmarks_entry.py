"""python -m benchmarks: every script in benchmarks/ is listed with one line, and NAME runs benchmarks/NAME.py with
the options that follow."""

import sys
from pathlib import Path

import pytest
import torch

from benchmarks.__main__ import BENCHMARKS, TOOLS, main

FOLDER = Path(__file__).resolve().parents[1] / "benchmarks"


def test_every_script_is_listed_once():
    scripts = {p.stem for p in FOLDER.glob("*.py")} - {"__main__", "common"}
    assert set(BENCHMARKS) | set(TOOLS) == scripts
    assert not set(BENCHMARKS) & set(TOOLS)


def test_lists_names_and_refuses_an_unknown_one(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in (*BENCHMARKS, *TOOLS))
    assert main(["no-such-benchmark"]) == 2
    assert "unknown benchmark 'no-such-benchmark'" in capsys.readouterr().err


def test_passes_the_options_to_the_script(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # the entry sets the script's argv
    with pytest.raises(SystemExit):
        main(["image-latency", "--steps", "0"])
    assert "python -m benchmarks image_latency: error: --steps=0" in capsys.readouterr().err


def _word_encoder(bind: bool):
    """A stand-in encoder: each word's state is its own one-hot row and its position's, plus (``bind``) the state of
    the word two places on, as a digit would take in its way."""
    vocab = {}

    def encode(caption: str):
        words = caption.split()
        rows = [torch.zeros(64) for _ in words]
        for i, w in enumerate(words):
            rows[i][vocab.setdefault(w, len(vocab))] = 1.0
            rows[i][32 + i] = 1.0
        if bind:
            rows = [r + 0.5 * rows[i + 2] if i + 2 < len(rows) else r for i, r in enumerate(rows)]
        return words, torch.stack(rows)

    return encode


def test_text_binding_tells_bound_states_from_a_bag_of_words():
    """``benchmarks text_binding``: an encoder whose digit states ignore the way reads 1.0 for the swap; one whose
    digit takes in the way two words on reads less; replacing the digit reads less than either."""
    from benchmarks.text_binding import binding_cosines, caption_pairs

    pairs = caption_pairs(12)
    assert len(pairs) == 12 and all(d1 != d2 and m1 != m2 for (d1, d2), (m1, m2) in pairs)
    bag = binding_cosines(_word_encoder(False), pairs)
    bound = binding_cosines(_word_encoder(True), pairs)
    assert bag["digit token, ways swapped"] == pytest.approx(1.0)
    assert bound["digit token, ways swapped"] == pytest.approx(0.9)       # 2.25 / 2.5: the way's row differs
    assert bag["digit token, digit changed"] == pytest.approx(0.5)        # the position's row alone is shared
    assert bound["digit token, digit changed"] < bound["digit token, ways swapped"]


def test_text_binding_on_minilm_runs_offline(capsys):
    """The command as documented, on the installed MiniLM (2 captions): a digit's state tells digits apart far
    more than ways."""
    from benchmarks import text_binding

    result = text_binding.main(["--pairs", "2"])
    assert "digit token, ways swapped" in capsys.readouterr().out
    assert result["digit token, digit changed"] < 0.8 < result["digit token, ways swapped"]


def test_text_binding_probe_needs_the_refiner_for_a_bag_of_words():
    """``text_binding --probe``: with states that ignore the way, a readout of the digit token cannot tell its way
    (about chance, 0.25); a trained refiner can fetch the way from two words on."""
    from benchmarks.text_binding import refiner_probe

    probe = refiner_probe(_word_encoder(False), steps=300)
    plain, refined = probe.values()
    assert plain < 0.45
    assert refined > 0.9

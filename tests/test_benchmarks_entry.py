"""python -m benchmarks: every script in benchmarks/ is listed with one line, and NAME runs benchmarks/NAME.py with
the options that follow."""

import sys
from pathlib import Path

import pytest

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

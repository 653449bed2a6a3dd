"""benchmarks/image_latency.py: one row per shipped image model with a time per batch; bad counts refused."""

import re

import pytest

from benchmarks import image_latency


def test_prints_a_timed_row_per_model(capsys):
    image_latency.main(["--models", "image-linear", "image-mhla", "--batches", "1", "2", "--steps", "1",
                        "--rounds", "1"])
    out = capsys.readouterr().out
    assert "| model | batch 1 | batch 2 |" in out
    for name in ("image-linear", "image-mhla"):
        row = re.search(rf"^\| {name} \| (\d+) \(\d+-\d+\) \| (\d+) \(\d+-\d+\) \|$", out, re.M)
        assert row is not None, out
        assert all(int(ms) > 0 for ms in row.groups())


@pytest.mark.parametrize("args, words", [(["--steps", "0"], "--steps=0"), (["--batches", "1", "-2"], "--batches=-2"),
                                         (["--models", "no-such-model"], "no-such-model"),
                                         (["--runtime", "cuda-graphs", "--device", "cpu"], "cuda-graphs")])
def test_bad_arguments_are_refused_with_the_value(args, words, capsys):
    with pytest.raises(SystemExit):
        image_latency.main(args)
    assert words in capsys.readouterr().err

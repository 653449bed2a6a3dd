"""benchmarks/video_latency.py: a bad option is refused in one line naming it, its value and what is allowed."""

import pytest

from benchmarks.video_latency import parse_args


@pytest.mark.parametrize("argv, message", [
    (["--num-frames", "0"], "--num-frames=0 is not allowed: use 1 or more"),
    (["--rounds", "0"], "--rounds=0 is not allowed: use 1 or more"),
    (["--runtimes", "eager,warp"], "--runtimes: runtime='warp' is not allowed: use one of"),
    (["--runtimes", "cuda-graphs", "--device", "cpu"], "--runtimes: runtime='cuda-graphs' is not allowed on device cpu"),
    (["--dtype", "fp8", "--device", "cpu"], "--dtype='fp8' is not allowed: use one of bf16, fp16, fp32"),
])
def test_refuses_bad_options(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit):
        parse_args([str(tmp_path), *argv])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert message in err


def test_refuses_a_folder_without_a_pipeline(capsys, tmp_path):
    with pytest.raises(SystemExit):
        parse_args([str(tmp_path), "--device", "cpu"])
    assert f"pipelines: {str(tmp_path)!r} is not allowed: use a pipeline folder" in capsys.readouterr().err

"""End-to-end latency sweep (tiny model on the CPU) and the latency plot."""

import pytest

from mediagen.eval.e2e_bench import bench_end_to_end, e2e_markdown_table
from mediagen.eval.latency_plot import plot_latency


def test_e2e_sweep_table_and_plot(tmp_path):
    rows = bench_end_to_end("cpu", grids=[(1, 8, 8), (2, 8, 8)], attentions=("sdpa", "mhla"), repeats=1)
    assert {r["method"] for r in rows} == {"sdpa", "mhla"}
    assert all(r["fwd_ms"] and r["fwd_ms"] > 0 for r in rows), rows
    assert sorted({r["N"] for r in rows}) == [64, 128]
    table = e2e_markdown_table(rows)
    assert table.count("\n") == 1 + len(rows) and "1.00×" in table
    png = plot_latency(rows, tmp_path / "lat.png")
    data = open(png, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_plot_needs_times(tmp_path):
    with pytest.raises(ValueError, match="no rows"):
        plot_latency([{"N": 4, "method": "x", "fwd_ms": None}], tmp_path / "x.png")


def test_e2e_rejects_image_preset():
    with pytest.raises(ValueError, match="Wan-style"):
        bench_end_to_end("cpu", preset="dit-tiny", grids=[(1, 8, 8)])

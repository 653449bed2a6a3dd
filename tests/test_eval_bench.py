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


def test_measure_warms_up_repeats_and_reports_median_and_spread():
    """mediagen.eval.timing.measure: untimed warm-up calls, then the repeats (more while under a time budget);
    median and 20-80 percentile spread of the per-call times; CUDA graphs refused off CUDA."""
    from mediagen.eval.timing import Timing, measure

    calls, before = [], []
    t = measure(lambda: calls.append(1), "cpu", warmup=2, repeats=5, before_each=lambda: before.append(1))
    assert len(calls) == 7 and len(before) == 5 and len(t.times_ms) == 5
    assert t.min_ms <= t.median_ms <= t.max_ms and t.spread_ms >= 0
    assert len(measure(lambda: sum(range(1000)), warmup=0, repeats=1, budget_ms=5).times_ms) > 1
    timing = Timing((1.0, 2.0, 3.0, 4.0, 100.0))
    assert timing.median_ms == 3.0 and timing.spread_ms < 100 and Timing((2.0,)).spread_ms == 0
    with pytest.raises(ValueError, match="CUDA"):
        measure(lambda: None, "cpu", graph=True)
    with pytest.raises(ValueError, match="repeats"):
        measure(lambda: None, repeats=0)

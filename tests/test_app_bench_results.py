"""The Benchmarks tab's recorded latency: the JSON shipped inside the package (no benchmarks/ folder
needed), the default two-line plot with its legend outside the axes, and the file's merge rule."""

import builtins
import io
import json
from pathlib import Path

import pytest

import mediagen
from mediagen.app import bench_results
from mediagen.eval.bench_report import RECORDED_LATENCY, record_attention_run
from mediagen.eval.latency_plot import latency_figure, plot_latency

PACKAGE = Path(mediagen.__file__).resolve().parent


@pytest.fixture
def no_repository(tmp_path, monkeypatch):
    """Run from an empty folder, with any read under a ``benchmarks`` folder failing, as for an
    installed package."""
    monkeypatch.chdir(tmp_path)
    for module, name in ((builtins, "open"), (io, "open")):
        real = getattr(module, name)

        def guarded(file, *args, _real=real, **kwargs):
            if isinstance(file, (str, Path)) and "benchmarks" in Path(file).parts:
                raise FileNotFoundError(f"{file}: the repository is not there")
            return _real(file, *args, **kwargs)

        monkeypatch.setattr(module, name, guarded)


def test_recorded_latency_ships_inside_the_package(no_repository):
    with pytest.raises(FileNotFoundError, match="not there"):                # the guard works
        (PACKAGE.parent / "benchmarks" / "RESULTS.md").read_text()
    path = bench_results.default_results_path()
    assert path == RECORDED_LATENCY and PACKAGE in path.parents and path.is_file()
    rows = bench_results.read_results()
    assert all(r["date"] and r["device"] and r["command"] for r in rows)
    wan = {r["method"]: r for r in rows if r["N"] == 32760}
    assert wan["mhla triton"]["fwd_graph_ms"] == 0.17 and wan["mhla triton"]["fwd_bwd_graph_ms"] == 0.572
    assert wan["sdpa cudnn"]["fwd_graph_ms"] == 11.708
    assert {r["N"] for r in rows} == {256, 1024, 16384, 32760, 75600}
    pyproject = (PACKAGE.parent / "pyproject.toml").read_text()
    assert '"recorded/*.json"' in pyproject                               # installed with the package


def test_benchmarks_tab_plots_recorded_without_the_repository(no_repository, tmp_path):
    from mediagen.app.handlers import MediagenApp

    app = MediagenApp(device="cpu", output_dir=tmp_path / "out")         # models load lazily: none here
    plot, text, downloads = app.benchmarks("recorded")
    assert Path(plot).stat().st_size > 10_000 and len(downloads) == 2
    assert "| Wan2.1-1.3B 81f 480x832 | 32760 | mhla triton | 0.170 | 0.572 |" in text
    plot, text, _ = app.benchmarks("recorded", "every method")
    assert Path(plot).is_file()


def test_default_series_is_mhla_against_the_fastest_sdpa_backend():
    rows = bench_results.read_results()
    y = bench_results.time_key(rows)
    picked = bench_results.select_series(rows, "mhla vs fastest sdpa", y)
    assert y == "fwd_graph_ms" and {r["method"] for r in picked} == {m for _, m in bench_results.FAMILIES}
    at_512 = {r["method"]: r for r in picked if r["N"] == 1024}
    assert at_512["sdpa (fastest backend)"]["picked"] == "sdpa cudnn" and at_512["sdpa (fastest backend)"][y] == 0.129
    assert at_512["mhla (fastest variant)"]["picked"] == "mhla triton"
    # rows of neither family (a CPU run of other names) fall back to every method
    other = [{"N": 64, "method": "linear", "fwd_ms": 1.0}]
    assert bench_results.select_series(other, "mhla vs fastest sdpa", "fwd_ms")[0]["method"] == "linear"
    with pytest.raises(ValueError, match="series='all' is not allowed"):
        bench_results.select_series(rows, "all", y)


def test_plot_legend_is_outside_the_axes_and_short():
    rows = bench_results.read_results()
    y = bench_results.time_key(rows)
    for series, most in (("mhla vs fastest sdpa", 2), ("every method", 6)):
        fig = latency_figure(bench_results.select_series(rows, series, y), y=y,
                             title=bench_results.recorded_title(rows))
        fig.canvas.draw()
        ax = fig.axes[0]
        legend = ax.get_legend()
        labels = [t.get_text() for t in legend.get_texts()]
        assert 2 <= len(labels) <= most and max(map(len, labels)) <= 24, labels
        renderer = fig.canvas.get_renderer()
        assert legend.get_window_extent(renderer).x0 >= ax.get_window_extent(renderer).x1   # right of the axes
        title = ax.title.get_window_extent(renderer)
        assert 0 <= title.x0 and title.x1 <= fig.bbox.width                 # the title is not cut
    assert bench_results.recorded_title(rows) == "Attention latency, recorded (NVIDIA H200, bf16)"


def test_missing_or_malformed_file_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="benchmarks.attention --json"):
        bench_results.read_results(tmp_path / "latency.json")
    (tmp_path / "latency.json").write_text("| a | b |\n")
    with pytest.raises(ValueError, match="not a recorded latency file"):
        bench_results.read_results(tmp_path / "latency.json")
    (tmp_path / "latency.json").write_text(json.dumps({"runs": [{"date": "d", "rows": [{"N": 4, "method": "x"}]}]}))
    with pytest.raises(ValueError, match="no row with a forward time"):
        bench_results.read_results(tmp_path / "latency.json")


def test_a_new_run_replaces_what_it_measured_again(tmp_path):
    path = tmp_path / "latency.json"
    row = {"shape": "s", "B": 1, "N": 64, "heads": "2x8", "floor_ms": 0.00123456}
    record_attention_run(path, [{**row, "method": "mhla triton", "fwd_ms": 2.0},
                                {**row, "method": "sdpa flash", "fwd_ms": 3.0, "GB/s": 9.0}],
                         command="old", date="2026-01-01", device="gpu", dtype="bf16")
    record_attention_run(path, [{**row, "method": "mhla triton", "fwd_ms": 1.0},
                                {**row, "method": "sdpa cudnn", "fwd_ms": None, "note": "refused"}],
                         command="new", date="2026-01-02", device="gpu", dtype="bf16", copy_bandwidth_tb_s=4.2)
    doc = json.loads(path.read_text())
    assert [r["command"] for r in doc["runs"]] == ["new", "old"]                 # newest first
    assert doc["runs"][0]["rows"] == [{**row, "floor_ms": 0.0012, "method": "mhla triton", "fwd_ms": 1.0}]
    assert doc["runs"][1]["rows"][0]["method"] == "sdpa flash" and "GB/s" not in doc["runs"][1]["rows"][0]
    # another dtype is another measurement; a run left with no rows is dropped
    record_attention_run(path, [{**row, "method": "sdpa flash", "fwd_ms": 5.0}], command="fp16", date="2026-01-03",
                         device="gpu", dtype="fp16")
    record_attention_run(path, [{**row, "method": "sdpa flash", "fwd_ms": 2.5}], command="newer", date="2026-01-04",
                         device="gpu", dtype="bf16")
    assert [r["command"] for r in json.loads(path.read_text())["runs"]] == ["newer", "fp16", "new"]
    rows = bench_results.read_results(path)
    assert {(r["method"], r["dtype"], r["fwd_ms"]) for r in rows} == {
        ("sdpa flash", "bf16", 2.5), ("sdpa flash", "fp16", 5.0), ("mhla triton", "bf16", 1.0)}
    with pytest.raises(ValueError, match="nothing to record"):
        record_attention_run(path, [{**row, "method": "x", "fwd_ms": None}], command="c", date="d", device="g",
                             dtype="bf16")
    png = plot_latency(bench_results.select_series(rows, "every method", "fwd_ms"), tmp_path / "p.png")
    assert Path(png).read_bytes()[:4] == b"\x89PNG"

"""The Benchmarks tab's recorded latency: the JSON shipped inside the package (no benchmarks/ folder
needed), the default two-line plot with its legend outside the axes, and the file's merge rule."""

import builtins
import io
import json
import re
from pathlib import Path

import pytest

import mediagen
from mediagen.app import bench_results
from mediagen.eval.bench_report import RECORDED_LATENCY, ROW_KEYS, record_attention_run
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


TIME_KEYS = [k for k in ROW_KEYS if k.endswith("_ms")]


def check_recorded_format(rows):
    """What the recorded file promises, whatever its numbers: every row names its run (date, device, command,
    dtype), its shape (name, batch, tokens, heads) and method, and has a forward time; times are positive
    milliseconds rounded to 4 decimals; one measurement per (shape, method, dtype), the latest; one shape is
    one problem (same B, N and heads); both compared families (mhla, sdpa) are there."""
    assert rows
    for r in rows:
        assert all(isinstance(r[k], str) and r[k] for k in ("date", "device", "command", "dtype", "shape",
                                                              "method", "heads")), r
        assert all(isinstance(r[k], int) and not isinstance(r[k], bool) and r[k] >= 1 for k in ("B", "N")), r
        assert r.get("fwd_ms") is not None or r.get("fwd_graph_ms") is not None, r
        for key in TIME_KEYS:
            if r.get(key) is not None:
                assert isinstance(r[key], (int, float)) and 0 < r[key] < 1e6 and round(r[key], 4) == r[key], (key, r)
        assert set(r) <= {"date", "device", "command", "dtype", *ROW_KEYS}, r
    keys = [(r["shape"], r["method"], r["dtype"]) for r in rows]
    assert len(keys) == len(set(keys)), "a (shape, method, dtype) recorded twice"
    problems = {}
    for r in rows:
        assert problems.setdefault(r["shape"], (r["B"], r["N"], r["heads"])) == (r["B"], r["N"], r["heads"]), r
    assert {r["method"].split()[0] for r in rows} >= {"mhla", "sdpa"}


def test_recorded_latency_ships_inside_the_package(no_repository):
    with pytest.raises(FileNotFoundError, match="not there"):                # the guard works
        (PACKAGE.parent / "benchmarks" / "RESULTS.md").read_text()
    path = bench_results.default_results_path()
    assert path == RECORDED_LATENCY and PACKAGE in path.parents and path.is_file()
    check_recorded_format(bench_results.read_results())
    pyproject = (PACKAGE.parent / "pyproject.toml").read_text()
    assert '"recorded/*.json"' in pyproject                               # installed with the package


def test_benchmarks_tab_plots_recorded_without_the_repository(no_repository, tmp_path):
    from mediagen.app.handlers import MediagenApp

    app = MediagenApp(device="cpu", output_dir=tmp_path / "out")         # models load lazily: none here
    plot, text, downloads = app.benchmarks("recorded")
    assert Path(plot).stat().st_size > 10_000 and len(downloads) == 2
    # one table line per recorded row, its times in ms to 3 decimals (a dash where not measured), then its date
    rows = bench_results.read_results()
    lines = text.splitlines()
    assert sum(line.startswith("| ") and not line.startswith("| shape") for line in lines) == len(rows)

    def ms(value):
        return "—" if value is None else f"{value:.3f}"

    for r in rows:
        line = (f"| {r['shape']} | {r['N']} | {r['method']} | {ms(r.get('fwd_graph_ms'))} | "
                f"{ms(r.get('fwd_bwd_graph_ms'))} | {ms(r.get('fwd_ms'))} | {r['date']} |")
        assert line in lines, line
    plot, text, _ = app.benchmarks("recorded", "every method")
    assert Path(plot).is_file()


def test_default_series_is_mhla_against_the_fastest_sdpa_backend():
    """Per sequence length, the fastest method of each family, on rows made up for the purpose (CUDA-graph times
    preferred over eager ones when any row has them), then on the recorded file, where the picks are recomputed
    from its own rows."""
    made_up = [
        {"N": 64, "method": "mhla triton", "fwd_graph_ms": 2.0, "fwd_ms": 0.1},
        {"N": 64, "method": "mhla blocked", "fwd_graph_ms": 1.5},
        {"N": 64, "method": "sdpa cudnn", "fwd_graph_ms": 3.0},
        {"N": 64, "method": "sdpa flash", "fwd_graph_ms": 2.5},
        {"N": 64, "method": "linear", "fwd_graph_ms": 0.5},                 # neither family: left out
        {"N": 256, "method": "sdpa cudnn", "fwd_graph_ms": 4.0},
        {"N": 256, "method": "sdpa flash", "fwd_graph_ms": None, "fwd_ms": 1.0},  # no time of the kind plotted
        {"N": 256, "method": "mhla triton", "fwd_graph_ms": 5.0},
    ]
    y = bench_results.time_key(made_up)
    assert y == "fwd_graph_ms"
    picked = bench_results.select_series(made_up, "mhla vs fastest sdpa", y)
    assert [(r["N"], r["method"], r["picked"], r[y]) for r in picked] == [
        (64, "mhla (fastest variant)", "mhla blocked", 1.5), (256, "mhla (fastest variant)", "mhla triton", 5.0),
        (64, "sdpa (fastest backend)", "sdpa flash", 2.5), (256, "sdpa (fastest backend)", "sdpa cudnn", 4.0)]
    assert bench_results.time_key([{"N": 64, "method": "x", "fwd_ms": 1.0}]) == "fwd_ms"

    rows = bench_results.read_results()
    y = bench_results.time_key(rows)
    picked = bench_results.select_series(rows, "mhla vs fastest sdpa", y)
    assert {r["method"] for r in picked} == {m for _, m in bench_results.FAMILIES}
    for prefix, label in bench_results.FAMILIES:
        timed = [r for r in rows if r["method"].startswith(prefix) and r.get(y) is not None]
        want = {n: min((r for r in timed if r["N"] == n), key=lambda r: r[y]) for n in {r["N"] for r in timed}}
        got = {r["N"]: r for r in picked if r["method"] == label}
        assert sorted(got) == sorted(want)
        assert all(got[n]["picked"] == want[n]["method"] and got[n][y] == want[n][y] for n in want)
    # rows of neither family (a CPU run of other names) fall back to every method
    other = [{"N": 64, "method": "linear", "fwd_ms": 1.0}]
    assert bench_results.select_series(other, "mhla vs fastest sdpa", "fwd_ms")[0]["method"] == "linear"
    with pytest.raises(ValueError, match="series='all' is not allowed"):
        bench_results.select_series(rows, "all", y)


def test_plot_legend_is_outside_the_axes_and_short():
    rows = bench_results.read_results()
    y = bench_results.time_key(rows)
    for series in ("mhla vs fastest sdpa", "every method"):
        fig = latency_figure(bench_results.select_series(rows, series, y), y=y,
                             title=bench_results.recorded_title(rows))
        fig.canvas.draw()
        ax = fig.axes[0]
        legend = ax.get_legend()
        labels = [t.get_text() for t in legend.get_texts()]
        picked = bench_results.select_series(rows, series, y)
        assert labels == list(dict.fromkeys(r["method"] for r in picked))   # one entry per line, in row order
        assert len(labels) >= 2 and max(map(len, labels)) <= 24, labels
        if series == "mhla vs fastest sdpa":
            assert len(labels) == 2
        renderer = fig.canvas.get_renderer()
        assert legend.get_window_extent(renderer).x0 >= ax.get_window_extent(renderer).x1   # right of the axes
        title = ax.title.get_window_extent(renderer)
        assert 0 <= title.x0 and title.x1 <= fig.bbox.width                 # the title is not cut
    # the title names the devices (without their software versions) and dtypes of the rows
    made_up = [{"device": "NVIDIA H200, torch 2.11.0, triton 3.6.0", "dtype": "bf16"},
               {"device": "NVIDIA H200, torch 2.10.0", "dtype": "fp16"}, {"device": "", "dtype": ""}]
    assert bench_results.recorded_title(made_up) == "Attention latency, recorded (NVIDIA H200, bf16, fp16)"
    assert bench_results.recorded_title([{"N": 4}]) == "Attention latency, recorded"


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


def test_fresh_measurement_times_the_path_the_models_run():
    """On a CPU the models run MHLA through the op's default path (blocked), not the fp32 reference the
    kernels are tested against: "measured now" times that path, beside SDPA."""
    from mediagen.eval.attention_bench import Shape

    tiny = [Shape("tiny a", 1, (4, 4), 2, 16, (2, 2)), Shape("tiny b", 1, (8, 8), 2, 16, (2, 2))]
    rows = bench_results.fresh_rows("cpu", rep_ms=1.0, shapes=tiny)
    methods = {r["method"] for r in rows}
    assert bench_results.model_path("cpu") == "mhla blocked"
    assert "mhla blocked" in methods and "sdpa math" in methods and not any("reference" in m for m in methods)
    assert {r["N"] for r in rows} == {16, 64} and all(r["fwd_min_ms"] <= r["fwd_ms"] <= r["fwd_max_ms"] for r in rows)


def test_fresh_plot_shows_the_spread_and_plain_tick_labels():
    rows = [{"method": m, "N": n, "fwd_ms": ms, "fwd_min_ms": ms * 0.9, "fwd_max_ms": ms * 1.2, "runs": 3}
            for m, scale in (("mhla blocked", 1.0), ("sdpa math", 1.5))
            for n, ms in ((256, 5.5 * scale), (1024, 7.0 * scale))]
    picked = bench_results.select_series(rows, "mhla vs fastest sdpa", "fwd_ms")
    assert all(r["fwd_min_ms"] < r["fwd_ms"] < r["fwd_max_ms"] for r in picked)       # the spread goes along
    fig = bench_results.figure(picked, "fwd_ms", "measured now (cpu)")
    fig.canvas.draw()
    ax = fig.axes[0]
    bars = [c for c in ax.collections if len(c.get_segments()) == 2]                   # one bar per point
    from matplotlib.colors import to_rgba

    assert len(bars) == 2                                                               # in the lines' colours
    assert {tuple(b.get_color()[0]) for b in bars} == {to_rgba(line.get_color()) for line in ax.get_lines()}
    low, high = sorted(bars[0].get_segments()[0][:, 1])
    assert low == pytest.approx(5.5 * 0.9) and high == pytest.approx(5.5 * 1.2)
    labels = [t.get_text() for t in ax.get_yticklabels(minor=True) + ax.get_yticklabels() if t.get_text()]
    assert labels and all(re.fullmatch(r"[\d,.]+", t) for t in labels), labels         # "6", not "6x10^0"
    assert "6" in labels
    import matplotlib.pyplot as plt
    plt.close(fig)

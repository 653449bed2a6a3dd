"""The Benchmarks tab's recorded sampling time per clip (MHLA beside softmax): the JSON shipped inside the
package, the merge of video_latency outputs into it (same key replaced, others kept, written in one step),
the tab's plot data with the MHLA / softmax ratio from the rows, and one line for a bad file."""

import json
from pathlib import Path

import pytest

import mediagen
from mediagen.app import bench_results
from mediagen.eval.model_latency import RECORDED_MODEL_LATENCY, read_model_latency, record_video_latency

PACKAGE = Path(mediagen.__file__).resolve().parent
REPO = PACKAGE.parent


def output(device, rows, date="2026-12-06T00:00:00+00:00", commit="abc1234", **meta):
    """A ``benchmarks/video_latency.py --out`` document: rows of (attention, runtime, tokens, s per clip)."""
    return {"meta": {"device": device, "dtype": "bf16" if "NVIDIA" in device else "fp32", "num_frames": 32,
                     "height": 128, "width": 128, "steps": 8, "guidance": 4.0, "batch": 1, "rounds": 3,
                     "runtimes": list(dict.fromkeys(r[1] for r in rows)), "commit": commit, "date": date, **meta},
            "results": [{"pipeline": f"video-{a}", "runtime": rt, "attention": a, "tokens_per_clip": n,
                         "token_grid": [n // 256, 16, 16], "median_s_per_call": s, "median_s_per_clip": s,
                         "min_s_per_call": s * 0.9, "max_s_per_call": s * 1.1, "peak_mem_mib": 100.0,
                         "speedup_vs_first": 1.0, "first": "video-mhla"} for a, rt, n, s in rows]}


def write(path, doc):
    path.write_text(json.dumps(doc))
    return path


def test_recorded_sampling_time_ships_inside_the_package():
    assert RECORDED_MODEL_LATENCY == PACKAGE / "eval" / "recorded" / "model_latency.json"
    assert bench_results.default_model_results_path() == RECORDED_MODEL_LATENCY
    assert '"recorded/*.json"' in (REPO / "pyproject.toml").read_text()            # installed with the package
    rows = read_model_latency()
    for r in rows:
        assert all(isinstance(r[k], str) and r[k] for k in ("device", "attention", "runtime", "command", "commit",
                                                              "date", "dtype")), r
        assert r["command"].startswith("python -m benchmarks video_latency ")
        assert isinstance(r["tokens_per_clip"], int) and r["tokens_per_clip"] > 0 and r["s_per_clip"] > 0
        assert (r["steps"], r["guidance"]) == (8, 4.0)                                  # the app's defaults
    keys = [(r["device"], r["attention"], r["runtime"], r["tokens_per_clip"]) for r in rows]
    assert len(keys) == len(set(keys))
    # the CPU run is there, MHLA beside softmax at 32x128x128 = 8,192 tokens
    cpu = {r["attention"]: r for r in rows if r["device"].startswith("cpu") and r["tokens_per_clip"] == 8192}
    assert set(cpu) >= {"mhla", "sdpa"} and cpu["mhla"]["s_per_clip"] < cpu["sdpa"]["s_per_clip"]


def test_merge_replaces_the_same_key_and_keeps_the_others(tmp_path):
    path = tmp_path / "model_latency.json"
    cpu = write(tmp_path / "cpu.json", output("cpu (x86_64, 2 threads)", [("mhla", "eager", 8192, 21.7),
                                                                         ("sdpa", "eager", 8192, 95.6)], commit="c1"))
    gpu = write(tmp_path / "gpu.json", output("NVIDIA H200", [
        ("mhla", "eager", 1024, 0.5), ("sdpa", "eager", 1024, 0.6), ("mhla", "cuda-graphs", 1024, 0.2),
        ("sdpa", "cuda-graphs", 1024, 0.25)], commit="g1", command="python -m benchmarks video_latency x --out g"))
    record_video_latency([cpu], path)
    record_video_latency([gpu], path)
    # a newer CPU run of MHLA alone: it replaces the CPU mhla row, the CPU sdpa row and the GPU rows stay
    newer = write(tmp_path / "cpu2.json", output("cpu (x86_64, 2 threads)", [("mhla", "eager", 8192, 20.0)],
                                                 date="2026-12-07T00:00:00+00:00", commit="c2"))
    doc = record_video_latency([newer], path)
    assert [run["commit"] for run in doc["runs"]] == ["c2", "g1", "c1"]                  # newest first
    rows = read_model_latency(path)
    got = {(r["device"][:3], r["attention"], r["runtime"], r["tokens_per_clip"]): (r["s_per_clip"], r["commit"])
           for r in rows}
    assert got == {("cpu", "mhla", "eager", 8192): (20.0, "c2"), ("cpu", "sdpa", "eager", 8192): (95.6, "c1"),
                   ("NVI", "mhla", "eager", 1024): (0.5, "g1"), ("NVI", "sdpa", "eager", 1024): (0.6, "g1"),
                   ("NVI", "mhla", "cuda-graphs", 1024): (0.2, "g1"), ("NVI", "sdpa", "cuda-graphs", 1024): (0.25, "g1")}
    by_commit = {r["commit"]: r for r in rows}
    assert by_commit["g1"]["command"] == "python -m benchmarks video_latency x --out g"   # the file's own command
    assert by_commit["c1"]["command"] == ("python -m benchmarks video_latency video-mhla video-sdpa --device cpu "
                                          "--dtype fp32 --num-frames 32 --height 128 --width 128 --steps 8 "
                                          "--guidance 4.0 --batch 1 --rounds 3 --runtimes eager")   # rebuilt
    assert by_commit["c1"]["source"] == str(cpu)
    # a run whose rows were all measured again is dropped; several files in one call: the later one wins
    again = write(tmp_path / "cpu3.json", output("cpu (x86_64, 2 threads)", [("sdpa", "eager", 8192, 90.0)],
                                                 commit="c3"))
    last = write(tmp_path / "cpu4.json", output("cpu (x86_64, 2 threads)", [("sdpa", "eager", 8192, 80.0)],
                                                commit="c4"))
    doc = record_video_latency([again, last], path)
    assert [run["commit"] for run in doc["runs"]] == ["c4", "c2", "g1"]
    assert {r["s_per_clip"] for r in read_model_latency(path) if r["attention"] == "sdpa" and r["device"][:3] == "cpu"} \
        == {80.0}


def test_merge_checks_every_file_before_writing(tmp_path, capsys):
    from benchmarks.record_model_latency import main

    path = tmp_path / "model_latency.json"
    good = write(tmp_path / "good.json", output("NVIDIA H200", [("mhla", "eager", 1024, 0.5)]))
    assert main([str(good), "--into", str(path)]) == 0
    assert "NVIDIA H200 | mhla | eager | 1,024 tokens | 0.500 s/clip" in capsys.readouterr().out
    before = path.read_text()
    newer = write(tmp_path / "newer.json", output("NVIDIA H200", [("mhla", "eager", 1024, 0.4)]))
    bad = write(tmp_path / "bad.json", {"meta": {"device": "x", "date": "d"}, "results": [{"attention": "mhla"}]})
    with pytest.raises(SystemExit):
        main([str(newer), str(bad), "--into", str(path)])
    err = capsys.readouterr().err
    assert f"{bad}: not a video_latency output (KeyError: 'runtime')" in err
    assert path.read_text() == before and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ValueError, match="broken.json: cannot read it as JSON"):
        record_video_latency([tmp_path / "broken.json"], path)
    with pytest.raises(ValueError, match="two rows of one"):
        record_video_latency([output("g", [("mhla", "eager", 64, 1.0), ("mhla", "eager", 64, 2.0)])], path)
    assert path.read_text() == before


def test_tab_plots_time_per_clip_with_the_mhla_softmax_ratio(tmp_path):
    path = tmp_path / "model_latency.json"
    record_video_latency([output("cpu (x86_64, 2 threads)", [("mhla", "eager", 8192, 20.0), ("sdpa", "eager", 8192, 80.0)],
                                 commit="c1", date="2026-12-05T02:31:52+00:00"),
                          output("NVIDIA H200", [("mhla", "eager", 1024, 0.5), ("sdpa", "eager", 1024, 0.4),
                                                 ("mhla", "eager", 16384, 2.0), ("sdpa", "eager", 16384, 8.0),
                                                 ("mhla", "cuda-graphs", 16384, 1.0)],
                                 commit="g1", date="2026-12-06T00:00:00+00:00", command="python -m benchmarks "
                                 "video_latency video-mhla video-sdpa --runtimes eager,cuda-graphs")], path)
    view = bench_results.model_view(path, tmp_path)
    assert "error" not in view
    lines = {(s["attention"], s["runtime"], s["device"]): s["points"] for s in view["series"]}
    assert lines == {("mhla", "eager", "cpu (x86_64, 2 threads)"): [(8192, 20.0)],
                     ("sdpa", "eager", "cpu (x86_64, 2 threads)"): [(8192, 80.0)],
                     ("mhla", "eager", "NVIDIA H200"): [(1024, 0.5), (16384, 2.0)],
                     ("sdpa", "eager", "NVIDIA H200"): [(1024, 0.4), (16384, 8.0)],
                     ("mhla", "cuda-graphs", "NVIDIA H200"): [(16384, 1.0)]}
    assert {s["label"] for s in view["series"]} >= {"mhla, eager, cpu", "mhla, cuda-graphs, NVIDIA H200"}
    # the ratio where both were measured on one device and runtime (no sdpa under cuda-graphs: no ratio there)
    ratios = {(q["device"][:3], q["runtime"], q["tokens_per_clip"]): (q["ratio"], q["speedup"]) for q in view["ratios"]}
    assert ratios == {("cpu", "eager", 8192): (0.25, 4.0), ("NVI", "eager", 1024): (1.25, 0.8),
                      ("NVI", "eager", 16384): (0.25, 4.0)}
    assert "| cpu | eager | 8,192 | 20.00 | 80.00 | 0.250 | 4.00× |" in view["text"]
    assert "| NVIDIA H200 | eager | 1,024 | 0.50 | 0.40 | 1.250 | 0.80× |" in view["text"]
    # the caption: device, command, commit and date of each run
    assert ("- NVIDIA H200, bf16, 32×128×128 clips, 8 steps, guidance 4, batch 1: `python -m benchmarks video_latency "
            "video-mhla video-sdpa --runtimes eager,cuda-graphs` · g1 · 2026-12-06") in view["caption"]
    assert "- cpu (x86_64, 2 threads), fp32," in view["caption"] and "· c1 · 2026-12-05" in view["caption"]
    assert view["caption"] in view["text"]
    assert Path(view["plot"]).read_bytes()[:4] == b"\x89PNG"
    fig = bench_results.model_figure(read_model_latency(path))
    ax = fig.axes[0]
    assert ax.get_xlabel() == "tokens per clip" and "per clip (s)" in ax.get_ylabel()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [s["label"] for s in view["series"]]
    import matplotlib.pyplot as plt
    plt.close(fig)


def test_the_app_shows_the_shipped_sampling_time(tmp_path):
    from mediagen.app.handlers import MediagenApp

    app = MediagenApp(device="cpu", output_dir=tmp_path / "out")          # models load lazily: none here
    assert app.model_results_path == RECORDED_MODEL_LATENCY
    plot, text = app.model_latency()
    assert Path(plot).stat().st_size > 10_000
    cpu = {r["attention"]: r["s_per_clip"] for r in read_model_latency()
           if r["device"].startswith("cpu") and r["tokens_per_clip"] == 8192}
    assert f"| cpu | eager | 8,192 | {cpu['mhla']:.2f} | {cpu['sdpa']:.2f} | {cpu['mhla'] / cpu['sdpa']:.3f} |" in text


@pytest.mark.parametrize("content, message", [
    (None, "does not exist: no sampling time per clip has been recorded there"),
    ("| a | b |\n", "is not a recorded sampling-time file (JSONDecodeError"),
    (json.dumps({"runs": [{"device": "cpu", "rows": [{"attention": "mhla", "runtime": "eager"}]}]}),
     "is not a recorded sampling-time file (KeyError: 'tokens_per_clip')"),
    (json.dumps({"runs": [{"device": "cpu", "rows": [{"attention": "mhla", "runtime": "eager",
                                                      "tokens_per_clip": 64, "s_per_clip": -1}]}]}),
     "is not a recorded sampling-time file (ValueError"),
    (json.dumps({"runs": []}), "has no row with a time per clip to plot"),
])
def test_a_missing_or_malformed_file_gives_one_line_in_the_tab(tmp_path, content, message):
    from mediagen.app.handlers import MediagenApp

    path = tmp_path / "model_latency.json"
    if content is not None:
        path.write_text(content)
    view = bench_results.model_view(path, tmp_path)
    assert list(view) == ["error"] and message in view["error"] and "\n" not in view["error"]
    app = MediagenApp(device="cpu", output_dir=tmp_path / "out", model_results_path=path)
    plot, text = app.model_latency()
    assert plot is None and "\n" not in text and message in text and text.startswith("**Sampling time per clip:**")


def test_the_benchmarks_tab_has_the_sampling_time_beside_the_kernel_curves(tmp_path):
    """The tab's Plot button also fills the sampling-time plot and table; that is no API endpoint of its own,
    so the four named endpoints stay as they were."""
    from mediagen.app.handlers import MediagenApp
    from mediagen.app.limits import Limits
    from mediagen.app.models import ModelSet, ModelSource
    from mediagen.app.ui import build_demo

    models = ModelSet(image=ModelSource("dit-tiny", untrained=("sdpa", "mhla")),
                      video=ModelSource("wan-tiny", untrained=("sdpa", "mhla"), size={"frames": 3, "height": 8, "width": 8}),
                      text_encoders={"FlashAttention": "minilm"})
    app = MediagenApp(models, Limits(max_side=32, max_frames=5, max_steps=4, max_batch=2), device="cpu",
                      output_dir=tmp_path / "out")
    demo = build_demo(app)
    labels = {getattr(c, "label", None): c for c in demo.blocks.values()}
    image, table = labels["sampling time per clip vs tokens per clip"], labels["sampling time table"]
    fns = list(demo.fns.values() if isinstance(demo.fns, dict) else demo.fns)
    fn = next(f for f in fns if getattr(f.fn, "__name__", "") == "model_latency")
    assert [o._id for o in fn.outputs] == [image._id, table._id]
    bench = next(f for f in fns if f.api_name == "benchmarks")
    assert fn.targets == bench.targets                                      # the same Plot button
    assert set(demo.get_api_info()["named_endpoints"]) == {"/generate_image", "/generate_video", "/compare",
                                                           "/benchmarks"}

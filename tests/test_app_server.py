"""The Gradio app served on 127.0.0.1 with tiny models: every API endpoint through gradio_client,
readable out-of-bounds errors, eight concurrent requests, and a real headless Chromium render.

The tiny model set mirrors the shipped one: the video family's mhla model is a "trained" folder
(saved with blocks (2, 2, 2), a card.json beside it), so prompt-mode images run it on a one-frame
grid; image attentions are served untrained (declared so), and nothing else is offered."""

import os
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

gradio_client = pytest.importorskip("gradio_client")

from app_browser import install_chromium, render_page  # noqa: E402

from mediagen.app.app_cli import launch  # noqa: E402
from mediagen.app.handlers import MediagenApp  # noqa: E402
from mediagen.app.limits import Limits  # noqa: E402
from mediagen.app.models import ModelSet, ModelSource  # noqa: E402
from mediagen.eval.attention_bench import Shape  # noqa: E402
from mediagen.eval.bench_report import record_attention_run  # noqa: E402
from mediagen.models.presets import preset  # noqa: E402

LIMITS = Limits(max_side=32, max_frames=5, max_steps=4, max_batch=2, max_configs=4)
TINY_BENCH = [Shape("tiny a", 1, (4, 4), 2, 16, (2, 2)), Shape("tiny b", 1, (8, 8), 2, 16, (2, 2))]


CARD = {"trained_steps": 1200, "clips_seen": 38400, "scores": {"digit_ok": 0.5, "direction_ok": 0.25}}


def tiny_models(root: Path) -> ModelSet:
    import json

    import torch

    import mediagen
    from mediagen.models.presets import build_transformer

    wan = preset("wan-tiny")
    wan["config"]["text_dim"] = 384                                   # MiniLM's width
    torch.manual_seed(0)
    trained = mediagen.convert(build_transformer(wan), "mhla", blocks=[2, 2, 2], rope="features", out_norm=True)
    trained.save_pretrained(root / "video-mhla")
    (root / "video-mhla" / "card.json").write_text(json.dumps(CARD))
    calib = {"calibration_prompts": 8}
    # the defaults the shipped cards name (default_for): mhla for every task
    return ModelSet(image=ModelSource("dit-tiny", untrained=("sdpa", "mhla", "linear"),
                                      defaults={"class-to-image": "mhla"}),
                    video=ModelSource(wan, trained={"mhla": str(root / "video-mhla")}, untrained=("sdpa",),
                                      defaults={"text-to-video": "mhla", "text-to-image": "mhla"},
                                      size={"frames": 3, "height": 8, "width": 8}),
                    text_encoders={"FlashAttention": "minilm", "MLRA": "minilm-mlra2", "HLA": "minilm-hla"},
                    text_encoder_options={"MLRA": calib, "HLA": calib})


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("app")
    results = root / "attention_latency.json"
    rows = [{"shape": "s", "B": 1, "N": n, "heads": "2x8", "method": m, "fwd_ms": ms, "fwd_graph_ms": ms / 2}
            for n, m, ms in [(256, "sdpa flash", 0.1), (1024, "sdpa flash", 0.9), (256, "mhla triton", 0.2),
                             (1024, "mhla triton", 0.3)]]
    record_attention_run(results, rows, command="test", date="2026-01-01", device="test GPU", dtype="bf16")
    app = MediagenApp(tiny_models(root), LIMITS, device="cpu", output_dir=root / "out", results_path=results,
                      bench_shapes=TINY_BENCH)
    demo, url = launch(app, "127.0.0.1", None, concurrency=2, max_queue=16, block=False)
    client = gradio_client.Client(url, verbose=False, download_files=str(root / "downloads"))
    yield app, url, client, demo
    client.close()
    demo.close()


def _read(path) -> np.ndarray:
    return np.asarray(Image.open(path))


def test_serves_on_localhost_with_the_four_endpoints(served):
    app, url, client, _ = served
    assert re.match(r"http://127\.0\.0\.1:\d+/?$", url)
    names = set(client.view_api(print_info=False, return_format="dict")["named_endpoints"])
    assert {"/generate_image", "/generate_video", "/compare", "/benchmarks"} <= names


def test_generate_image_class_and_prompt(served):
    app, _, client, _ = served
    gallery, files, timings, note = client.predict("class", 3, "", "", "mhla", "FlashAttention", 2, 1, 2, 4.0, 8, 8,
                                                   api_name="/generate_image")
    assert note == ""
    assert len(gallery) == 2 and len(files) == 2
    side = app.page_defaults()["image_side"]
    assert _read(files[0]).shape[:2] == (side, side)                    # downloads at the model's size
    assert timings["denoising_ms"] > 0 and timings["text_encoding_ms"] == 0
    # the video model's mhla checkpoint (blocks (2, 2, 2)) on a one-frame grid (1, 4, 6)
    gallery, files, timings, note = client.predict("prompt", 0, "the digit 7", "", "mhla", "HLA", 1, 1, 2, 4.0, 8,
                                                   12, api_name="/generate_image")
    assert note == ""                                                   # untrained: no template, all of it read
    assert len(files) == 1 and _read(files[0]).shape[:2] == (8, 12)
    assert set(timings) == {"text_encoding_ms", "denoising_ms", "decoding_ms", "total_ms"}
    assert timings["text_encoding_ms"] > 0


def test_prompt_image_is_the_middle_frame_of_a_trained_length_clip(served):
    from mediagen.app import generation

    cache = served[0].cache
    assert generation.still_frames(cache) == 3
    args = ("mhla", "FlashAttention", "the digit 3 moves left", None, 1, 5, 2, 4.0, 8, 8)
    image = generation.text_samples(cache, *args, 1).samples
    clip = generation.text_samples(cache, *args, 3).samples
    assert image.shape == (1, 8, 8, 1) and np.array_equal(image, clip[:, 1])


def test_app_video_equals_the_pipeline_given_the_prompt(served):
    """The app conditions the model exactly as the pipeline (and training) do: text states padded to
    the pipelines' max_sequence_length, so the same seed gives the same clip."""
    import torch

    from mediagen.app import generation
    from mediagen.app.sizes import video_grid
    from mediagen.pipelines.text_video import TextToVideoPipeline

    cache = served[0].cache
    app_clip = generation.text_samples(cache, "mhla", "FlashAttention", "the digit 3 moves left", None, 1, 4, 2,
                                       4.0, 8, 8, 3).samples
    encoder = cache.text_encoder("FlashAttention")
    pipe = TextToVideoPipeline(transformer=cache.transformer("video", "mhla", video_grid(cache, 3, 8, 8)),
                               scheduler=cache.scheduler("video"), vae=cache.vae("video"),
                               text_encoder=encoder.model, tokenizer=encoder.tokenizer)
    clip = pipe("the digit 3 moves left", height=8, width=8, num_frames=3, num_inference_steps=2, guidance_scale=4.0,
                generator=torch.Generator().manual_seed(4), output_type="np").frames
    assert np.abs(app_clip - clip).max() < 1e-4


def test_generate_video_is_downloadable_mp4(served):
    _, _, client, _ = served
    video, files, timings, note = client.predict("the digit 7 moving left", "", "sdpa", "MLRA", 3, 8, 8, 1, 0, 2,
                                                 4.0, api_name="/generate_video")
    assert note == ""                                                      # a prompt the models read: no note
    path = video["video"] if isinstance(video, dict) else video
    assert Path(path).suffix == ".mp4" and Path(files[0]).stat().st_size > 0
    from mediagen.eval.video_io import read_video

    assert read_video(files[0]).shape[0] == 3
    assert timings["text_encoding_ms"] > 0 and timings["denoising_ms"] > 0
    *_, note = client.predict("a cat moving left", "", "sdpa", "FlashAttention", 3, 8, 8, 1, 0, 2, 4.0,
                              api_name="/generate_video")
    assert note.startswith("The models cannot read this prompt: it names no digit")


def test_compare_video_runs_reference_and_reports_quality(served):
    _, _, client, _ = served
    gallery, files, table, details = client.predict(
        "text-to-video", ["mhla · FlashAttention", "sdpa · HLA"], "the digit 7 moving left", 0, 5, 2, 4.0, 3, 8, 8,
        api_name="/compare")
    assert [g["caption"] for g in gallery] == ["sdpa · FlashAttention", "mhla · FlashAttention", "sdpa · HLA"]
    assert len(files) == 3 and all(Path(f).suffix == ".mp4" for f in files)
    assert table["headers"][0] == "config" and table["headers"][-4:] == ["total ms", "denoise ms", "SSIM to ref",
                                                                          "PSNR to ref"]
    assert not any("e+" in cell for row in table["data"] for cell in row)     # times as plain ms
    ref, mhla, hla = details
    assert ref["psnr_db"] is None                                          # ∞: the reference against itself
    assert ref["ssim"] == pytest.approx(1.0) or ref["blank"]
    assert mhla["blank"] or (np.isfinite(mhla["psnr_db"]) and mhla["ssim"] < 1.0)
    assert {"read as", "moved"} <= set(table["headers"])                   # what each verdict rests on
    for row in details:
        assert row["denoising_ms"] > 0 and row["text_encoding_ms"] > 0 and row["decoding_ms"] >= 0
        assert 0.0 <= row["temporal_flickering"] <= 1.0 and "vbench_total" in row
        assert 0.0 <= row["digit_identity"] <= 1.0
        assert re.fullmatch(r"\d|none", row["digit_read"]) and row["direction_found"] in ("left", "right", "up",
                                                                                          "down", "none")


def test_compare_class_images_dedupes_text_encoders(served):
    _, _, client, _ = served
    gallery, files, table, details = client.predict(
        "class-to-image", ["mhla", "mhla · HLA", "linear · FlashAttention"], "", 4, 5, 2, 4.0, 3, 8, 8,
        api_name="/compare")
    assert [d["config"] for d in details] == ["sdpa", "mhla", "linear"]
    for row in details:
        assert 0.0 <= row["digit_prob"] <= 1.0 and 0.0 < row["confidence"] <= 1.0


def test_benchmarks_recorded_and_fresh(served):
    _, _, client, _ = served
    plot, table, files = client.predict("recorded", api_name="/benchmarks")
    assert Image.open(plot).size[0] > 100 and "mhla triton" in table and "| 1024 |" in table
    assert "| 2026-01-01 |" in table
    plot, table, files = client.predict("recorded", "every method", api_name="/benchmarks")
    assert Image.open(plot).size[0] > 100
    plot, table, files = client.predict("fresh", api_name="/benchmarks")
    assert Image.open(plot).size[0] > 100 and "| 64 |" in table and "sdpa" in table
    assert "| mhla blocked | 64 |" in table and "reference" not in table      # the path the models run on a CPU


@pytest.mark.parametrize("endpoint, args, message", [
    ("/generate_image", ("class", 3, "", "", "mhla", "FlashAttention", 2, 0, 500, 4.0, 8, 8),
     "steps=500 is out of bounds: this server allows steps from 1 to 4"),
    ("/generate_image", ("class", 3, "", "", "mhla", "FlashAttention", 9, 0, 2, 4.0, 8, 8),
     "batch=9 is out of bounds"),
    ("/generate_video", ("x", "", "mhla", "FlashAttention", 64, 8, 8, 1, 0, 2, 4.0), "frames=64 is out of bounds"),
    ("/generate_video", ("x", "", "mhla", "FlashAttention", 3, 512, 8, 1, 0, 2, 4.0), "height=512 is out of bounds"),
    ("/generate_video", ("x", "", "mhla", "FlashAttention", 3, 7, 8, 1, 0, 2, 4.0), "height=7 must be a multiple of 2"),
    ("/compare", ("text-to-video", ["mhla · HLA", "sdpa · HLA", "sdpa · MLRA", "mhla · MLRA"], "x", 0, 0, 2, 4.0,
                  3, 8, 8), "5 configurations"),
    # the field named, with its range, whatever the value's type
    ("/generate_video", ("x", "n" * 10000, "mhla", "FlashAttention", 3, 8, 8, 1, 0, 2, 4.0),
     "negative_prompt has 10000 characters"),
    ("/generate_image", ("class", 3, "", "", "mhla", "FlashAttention", 1, 0, "abc", 4.0, 8, 8),
     "steps='abc' is not allowed: steps must be a whole number from 1 to 4"),
    ("/generate_image", ("class", 3, "", "", "mhla", "FlashAttention", 1, 0, 2.5, 4.0, 8, 8),
     "steps=2.5 is not allowed: steps must be a whole number from 1 to 4"),
    ("/generate_image", ("class", 3, "", "", "mhla", "FlashAttention", 1, -1, 2, 4.0, 8, 8),
     "seed=-1 is out of bounds: this server allows seed from 0 to 2147483647"),
    ("/generate_image", ("square", 3, "", "", "mhla", "FlashAttention", 1, 0, 2, 4.0, 8, 8),
     "mode='square' is not allowed: choose one of ['class', 'prompt']"),
    ("/generate_video", ("x", "", "mhla", "FlashAttention", 1, 8, 8, 1, 0, 2, 4.0),
     "frames=1 is out of bounds: this server allows frames from 2 to 5"),
    # nothing untrained on offer: the video family offers sdpa and its trained mhla only
    ("/generate_video", ("x", "", "linear", "FlashAttention", 3, 8, 8, 1, 0, 2, 4.0),
     "attention='linear' is not allowed for the text-to-video / text-to-image model"),
    ("/generate_image", ("prompt", 3, "x", "", "hybrid", "FlashAttention", 1, 0, 2, 4.0, 8, 8),
     "attention='hybrid' is not allowed for the text-to-video / text-to-image model"),
    ("/generate_image", ("class", 3, "", "", "hybrid", "FlashAttention", 1, 0, 2, 4.0, 8, 8),
     "attention='hybrid' is not allowed for the class-conditional image model"),
    ("/compare", ("text-to-video", ["linear · HLA"], "x", 0, 0, 2, 4.0, 3, 8, 8),
     "configs: 'linear · HLA' is not allowed for text-to-video"),
])
def test_out_of_bounds_gets_the_message_not_a_stack_trace(served, endpoint, args, message, capfd):
    _, _, client, _ = served
    capfd.readouterr()
    with pytest.raises(Exception) as err:
        client.predict(*args, api_name=endpoint)
    text = str(err.value)
    assert message in text
    assert "Traceback" not in text and 'File "' not in text
    log = capfd.readouterr().err
    assert "Traceback" not in log                                  # the server log: one line, no traceback


def _call(url, endpoint, data):
    """A raw HTTP call of an endpoint (no gradio_client defaults): (status code, the event's error or None)."""
    import json

    import httpx

    posted = httpx.post(f"{url.rstrip('/')}/gradio_api/call/{endpoint}", json={"data": data}, timeout=30)
    if posted.status_code != 200:
        return posted.status_code, posted.json()["error"]
    stream = httpx.get(f"{url.rstrip('/')}/gradio_api/call/{endpoint}/{posted.json()['event_id']}", timeout=120).text
    errors = [json.loads(line[6:]) for line in stream.splitlines() if line.startswith("data: ") and "error" in line]
    return posted.status_code, errors[0]["error"] if errors else None


def test_api_edges_answer_one_line(served, capfd):
    """Too few inputs, an unknown endpoint and a boolean for a number each get one line naming what is
    wrong, and the server log gets no traceback."""
    _, url, client, _ = served
    capfd.readouterr()
    status, error = _call(url, "generate_image", ["class"])
    assert status == 200 and error == ("/generate_image got 1 input value but takes 14: give mode, class_label, "
                                       "prompt, negative_prompt, attention, text_encoder, batch, seed, steps, "
                                       "guidance, height, width, runtime, rewrite_prompt, in this order")
    status, error = _call(url, "no_such_endpoint", [1])
    assert status == 404 and error == ("there is no API endpoint /no_such_endpoint on this server: use one of "
                                       "['/generate_image', '/generate_video', '/compare', '/benchmarks']")
    with pytest.raises(Exception, match=r"steps=True is not allowed: steps must be a whole number from 1 to 4"):
        client.predict("class", 3, "", "", "mhla", "FlashAttention", 1, 0, True, 4.0, 8, 8, api_name="/generate_image")
    log = capfd.readouterr()
    assert "Traceback" not in log.err + log.out and "object at 0x" not in log.err + log.out


def test_api_names_every_output_and_defaults_steps_per_task(served):
    app, _, client, _ = served
    api = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    labels = [r["label"] for e in api.values() for r in e["returns"]]
    assert not any(label.startswith("value_") for label in labels), labels
    assert [r["label"] for r in api["/benchmarks"]["returns"]] == ["latency vs sequence length", "latency table",
                                                                   "download"]
    assert [r["label"] for r in api["/generate_video"]["returns"]] == ["video", "download", "latency per stage (ms)",
                                                                       "prompt note"]
    # steps left out: the mode's own steps, as the page starts them (more for a prompt-mode still)
    steps = {p["parameter_name"]: p for p in api["/generate_image"]["parameters"]}["steps"]
    assert steps["parameter_has_default"] and steps["parameter_default"] is None
    import dataclasses

    recorded = []
    original = app.budget.record
    app.budget.record = lambda key, steps, *a, **k: recorded.append(steps) or original(key, steps, *a, **k)
    app.limits = dataclasses.replace(LIMITS, default_steps=1, still_steps=3)     # both within max_steps here
    try:
        for mode in ("prompt", "class"):
            client.predict(mode=mode, class_label=3, prompt="the digit 7", negative_prompt="", attention="mhla",
                           text_encoder="FlashAttention", batch=1, seed=0, api_name="/generate_image")
    finally:
        app.budget.record, app.limits = original, LIMITS
    assert recorded == [3, 1]


def test_a_failed_run_keeps_the_outputs_and_prompts_stop_at_the_limit(served):
    """Progress and errors show on each tab's status line, so a failed request does not cover the previous
    outputs with "Error" badges; the prompt boxes stop at the server's length as the user types."""
    *_, demo = served
    config = demo.get_config_file()
    by_id = {c["id"]: c for c in config["components"]}
    runs = [dep for dep in config["dependencies"] if dep.get("api_name") in ("generate_image", "generate_video",
                                                                              "compare", "benchmarks")]
    assert len(runs) == 4
    for dep in runs:
        assert dep["show_progress_on"] and not set(dep["show_progress_on"]) & set(dep["outputs"]), dep["api_name"]
        assert all(by_id[i]["props"].get("elem_id", "").endswith("-status") for i in dep["show_progress_on"])
    boxes = [c for c in config["components"] if c["type"] == "textbox" and "prompt" in c["props"].get("label", "")]
    assert len(boxes) == 5 and all(b["props"]["max_length"] == LIMITS.max_prompt_chars for b in boxes)


def test_model_info_names_the_checkpoint_and_its_card(served):
    app, *_ = served
    assert app.info("video", "mhla") == ("<details><summary>video-mhla: 1,200 training steps; digit_ok 0.5, "
                                         "direction_ok 0.25</summary>\n\n- training: 38,400 clips seen\n\n</details>")
    assert "untrained" in app.info("image", "linear") and "not measured" in app.info("image", "linear")
    assert app.offered("video") == ["sdpa", "mhla"] and app.info("video", "linear") == ""


def test_models_load_once(served):
    app, _, client, _ = served
    calls = []
    cache = app.cache
    original = cache._load_transformer
    cache._load_transformer = lambda *a: calls.append(a) or original(*a)
    try:
        for _ in range(2):
            client.predict("class", 1, "", "", "mhla", "FlashAttention", 1, 0, 1, 1.0, 8, 8, api_name="/generate_image")
    finally:
        cache._load_transformer = original
    assert calls == []                                 # mhla for the image model was loaded by an earlier test
    assert cache.text_encoder("HLA") is cache.text_encoder("HLA")


def test_queue_is_bounded(served):
    *_, demo = served
    assert demo._queue.max_size == 16
    assert demo._queue.default_concurrency_limit == 2
    assert {fn.concurrency_limit for fn in demo.fns.values() if fn.api_name} == {"default"}


def test_eight_concurrent_requests_all_complete(served):
    _, _, client, _ = served
    attentions = ("sdpa", "mhla", "linear", "mhla")
    jobs = []
    for i in range(8):
        if i % 2:                                                      # text requests share the encoders
            jobs.append(client.submit(f"the digit {i} moving up", "", ("sdpa", "mhla")[i % 4 // 2],
                                      ("FlashAttention", "MLRA", "HLA")[i % 3],
                                      3, 8, 8, 1, i, 2, 4.0, api_name="/generate_video"))
        else:
            jobs.append(client.submit("class", i, "", "", attentions[i % 4], "FlashAttention", 1, i, 2, 4.0, 8, 8,
                                      api_name="/generate_image"))
    results = [job.result(timeout=180) for job in jobs]
    assert len(results) == 8
    assert len({r[1][0] for r in results}) == 8                       # eight distinct output files
    assert all(r[2]["denoising_ms"] > 0 for r in results)


def test_headless_chromium_renders_tabs_and_controls(served, tmp_path):
    _, url, _, _ = served
    binary = install_chromium()                                        # fails (not skips) when it cannot
    shot = Path(os.environ.get("MEDIAGEN_SCREENSHOT_DIR", tmp_path)) / "app.png"
    dom = render_page(binary, url, shot)
    image = Image.open(shot)
    assert image.size == (1280, 1600)
    pixels = np.asarray(image.convert("L"))
    assert pixels.std() > 5                                            # not a blank page
    for tab in ("Image", "Video", "Compare", "Benchmarks"):
        assert re.search(rf'role="tab"[^>]*>\s*(<[^>]*>\s*)*{tab}\b', dom), f"tab {tab} not in the rendered page"
    for control in ("image-run", "image-gallery", "seed"):
        assert f'id="{control}"' in dom, f"control #{control} not in the rendered page"
    for text in ("Generate image", "condition on", "attention", "text encoder", "mhla", "linear", "untrained",
                 "video-mhla"):
        assert text in dom, f"{text!r} not in the rendered page"


BROWSER_SESSION = r"""
const steps = () => numberBox('steps');
const shown = (text) => [...doc().querySelectorAll('label, span')].some(l => l.textContent.includes(text) &&
                                                                          l.offsetParent !== null);
log('loaded: ' + await until(() => doc().querySelector('#image-run') && steps().value === '4', 300));
log('size boxes in class mode: ' + shown('prompt mode'));
type(steps(), '3');
await pause(5);
choose('prompt');
await until(() => shown('negative prompt'), 100);
log('steps in prompt mode: ' + steps().value);
choose('class');
await until(() => !shown('negative prompt'), 100);
log('steps back in class mode: ' + steps().value);
doc().querySelector('#image-run').click();
await until(() => doc().querySelectorAll('#image-gallery img').length > 0, 600);
log('images: ' + doc().querySelectorAll('#image-gallery img').length);
type(steps(), '999');
await pause(2);
doc().querySelector('#image-run').click();
log('error on the status line: ' + await until(() =>
    /error/i.test(doc().querySelector('#image-status').parentElement.textContent), 300));
log('images kept: ' + doc().querySelectorAll('#image-gallery img').length);
log('gallery marked Error: ' + /\bError\b/.test(doc().querySelector('#image-gallery').textContent));
log('notice: ' + [...doc().querySelectorAll('.toast-body, [data-testid="toast-body"]')]
    .map(t => t.textContent.trim()).join(' | '));
"""


def test_a_browser_session_keeps_typed_steps_and_outputs(served):
    """As a user in headless Chromium: class mode opens without the prompt-mode size boxes and with its
    steps; a typed value survives switching to prompt mode and back; after a run, a refused request
    leaves the images in place (no "Error" over them), its message in a notice and on the status line."""
    import time

    from app_browser import HARNESS, drive_page
    from fastapi.responses import HTMLResponse

    _, url, _, demo = served
    page = HARNESS.format(app_url="/", sleep_url="/browser-sleep", script=BROWSER_SESSION)
    demo.app.add_api_route("/browser-session", lambda: HTMLResponse(page))
    demo.app.add_api_route("/browser-sleep", lambda: time.sleep(0.1))
    lines = drive_page(install_chromium(), url.rstrip("/") + "/browser-session")
    assert lines[:8] + lines[9:] == ["loaded: true", "size boxes in class mode: false", "steps in prompt mode: 3",
                                     "steps back in class mode: 3", "images: 2", "error on the status line: true",
                                     "images kept: 2", "gallery marked Error: false", "done"], lines
    assert lines[8].startswith("notice: ") and lines[8].endswith(
        "steps=999 is out of bounds: this server allows steps from 1 to 4"), lines

"""A video model served at its own long-clip size: the page and `mediagen generate` start at the size its card
gives, a CPU server widens its size bounds to it, and the time bound judges a first long clip from the recorded
sampling times (a softmax clip of 8,192 tokens takes minutes on a 2-core CPU, MHLA's a fraction of that)."""

import argparse
import json

import gradio as gr
import numpy as np
import pytest
from PIL import Image

from mediagen.app import limits
from mediagen.pipelines import catalog

LONG = {"frames": 32, "height": 128, "width": 128}


def test_a_recorded_time_estimates_its_own_size_until_this_server_runs_it():
    budget, key = limits.TimeBudget(max_seconds=90), ("video", "sdpa")
    budget.prior(key, 8, 16384, 96.0, "the times recorded for video-sdpa on a cpu")
    assert budget.estimate(key, 8, 16384) == pytest.approx(96.0)
    assert budget.estimate(key, 4, 16384) == pytest.approx(48.0)
    assert budget.estimate(key, 8, 2048) is None                       # another size: nothing known yet
    with pytest.raises(gr.Error, match=r"steps=8: this request would take about 96 s here \(estimated from the "
                                       r"times recorded for video-sdpa on a cpu\), past this server's 90 s per "
                                       r"request: use steps ≤ 7, or fewer frames"):
        budget.check(key, 8, 16384)
    # a recorded size is not fitted into the line of this server's own sizes (the cost is not linear across them)
    for tokens in (512, 2048):
        budget.record(key, 4, tokens, 4 * 0.001 * tokens, [0.001 * tokens] * 4)
    assert budget.estimate(key, 8, 4096) == pytest.approx(8 * 4.096)
    assert budget.estimate(key, 8, 16384) == pytest.approx(96.0)
    # once this server has run the recorded size, its own time is the estimate
    budget.record(key, 8, 16384, 40.0, [5.0] * 8)
    assert budget.estimate(key, 8, 16384) == pytest.approx(40.0)
    assert budget.basis(key, 16384) == "this server's earlier requests"
    budget.prior(key, 0, 16384, 10.0, "x")                            # nothing usable: ignored
    budget.prior(key, 8, 0, 10.0, "x")
    assert budget.estimate(key, 8, 16384) == pytest.approx(40.0)


def test_cpu_limits_widen_to_the_served_models_size_and_no_further():
    small = limits.Limits.for_device("cpu", served={"frames": 16, "height": 64, "width": 64})
    assert (small.max_side, small.max_frames) == (64, 17)
    long = limits.Limits.for_device("cpu", served=LONG)
    assert (long.max_side, long.max_frames) == (128, 32) and long.max_request_s == 90.0
    huge = limits.Limits.for_device("cpu", served={"frames": 81, "height": 480, "width": 832})
    assert (huge.max_side, huge.max_frames) == (limits.Limits().max_side, limits.Limits().max_frames)
    assert limits.Limits.for_device("cuda", served=LONG) == limits.Limits.for_device("cuda")
    assert limits.Limits.for_device("cpu", served=LONG, max_side=64).max_side == 64   # an override wins


def _tiny_video_checkpoint(root, label, card):
    from mediagen.models import build_transformer

    build_transformer("wan-tiny").save_pretrained(root / f"video-{label}")
    (root / f"video-{label}" / "card.json").write_text(json.dumps(card))


def test_a_cards_default_size_is_where_the_page_and_generate_start(tmp_path, monkeypatch):
    from mediagen.app.models import default_models
    from mediagen.cli import main

    size = {"frames": 5, "height": 16, "width": 8}
    _tiny_video_checkpoint(tmp_path, "sdpa", {"default_for": ["text-to-video"], "default_size": size})
    assert catalog.default_size("video", tmp_path) == size
    assert default_models(tmp_path).video.size == size
    monkeypatch.setenv("MEDIAGEN_CHECKPOINTS", str(tmp_path))
    out = tmp_path / "clip.gif"
    assert main(["generate", "--model", "video-sdpa", "--prompt", "x", "--steps", "1", "--out", str(out)]) == 0
    with Image.open(out) as gif:
        assert (gif.n_frames, gif.height, gif.width) == (5, 16, 8)
    # without the key: the preset's size, as before
    (tmp_path / "video-sdpa" / "card.json").write_text(json.dumps({"default_for": ["text-to-video"]}))
    assert catalog.default_size("video", tmp_path) is None
    preset = default_models(tmp_path).video.size
    assert (preset["frames"], preset["height"], preset["width"]) == (16, 64, 64)


def test_a_server_allows_every_trained_size_while_the_page_starts_at_the_quick_one(tmp_path, monkeypatch):
    """Cards that list both trained sizes and no default_size: the page starts at the preset's 16 x 64 x 64 (quick
    on a CPU) and a CPU server, built by the app or by `mediagen app`, widens its bounds to 32 x 128 x 128."""
    from mediagen.app import app_cli
    from mediagen.app.handlers import MediagenApp
    from mediagen.app.models import default_models, served_size

    both = {"trained_on": {"digits": 1, "sizes": [{"frames": 16, "height": 64, "width": 64}, LONG]}}
    _tiny_video_checkpoint(tmp_path, "sdpa", {"default_for": ["text-to-video"], **both})
    _tiny_video_checkpoint(tmp_path, "mhla", {"trained_on": {"digits": 1, "sizes": [{"frames": 8, "height": 0}]}})
    assert catalog.largest_trained_size("video", tmp_path) == LONG      # the malformed entry is skipped
    models = default_models(tmp_path)
    assert {k: models.video.size[k] for k in catalog.SIZE_KEYS} == {"frames": 16, "height": 64, "width": 64}
    assert served_size(models.video) == LONG
    app = MediagenApp(models, device="cpu", output_dir=tmp_path / "out")
    assert (app.limits.max_side, app.limits.max_frames) == (128, 32)
    seen = {}
    monkeypatch.setattr(app_cli, "launch", lambda app, *a: seen.update(limits=app.limits))
    parser = argparse.ArgumentParser()
    app_cli.register(parser.add_subparsers())
    args = parser.parse_args(["app", "--checkpoints", str(tmp_path), "--device", "cpu", "--no-preload",
                              "--output-dir", str(tmp_path / "cli")])
    assert app_cli.run(args) == 0 and (seen["limits"].max_side, seen["limits"].max_frames) == (128, 32)
    # cards without sizes: the bounds follow the page's size, as before
    for label in ("sdpa", "mhla"):
        (tmp_path / f"video-{label}" / "card.json").write_text("{}")
    assert catalog.largest_trained_size("video", tmp_path) is None
    assert served_size(default_models(tmp_path).video) == default_models(tmp_path).video.size


@pytest.mark.parametrize("bad", [[32, 128, 128], {"frames": 32, "height": 128}, {"frames": 0, "height": 8, "width": 8},
                                 {"frames": True, "height": 8, "width": 8}, {"frames": 2.5, "height": 8, "width": 8}])
def test_a_malformed_default_size_is_named(bad):
    with pytest.raises(ValueError, match=r"card.json default_size=.* is not allowed: use \{\"frames\": F"):
        catalog.card_size({"default_size": bad})


def test_the_first_long_softmax_clip_on_a_cpu_is_refused_with_what_mhla_takes(tmp_path):
    """The shipped models and the shipped recorded times, as a CPU server starts: a long clip with softmax is
    refused before it runs, with the recorded estimate and MHLA's time for the same clip."""
    from mediagen.app.bench_results import read_model_latency
    from mediagen.app.handlers import MediagenApp
    from mediagen.app.models import default_models

    models = default_models()
    models.video.served = dict(LONG)                                   # a model trained at 32 x 128 x 128
    app = MediagenApp(models, device="cpu", output_dir=tmp_path / "out")
    assert (app.limits.max_side, app.limits.max_frames) == (128, 32)
    recorded = {r["pipeline"]: r["s_per_clip"] for r in read_model_latency(app.model_results_path)
                if r["device"].startswith("cpu") and r["tokens_per_clip"] == 8192 and r["runtime"] == "eager"}
    assert recorded["video-sdpa"] > 90 > recorded["video-mhla"]
    with pytest.raises(gr.Error) as refused:
        app.video("the digit 3 moves left", "", "sdpa", "FlashAttention", 32, 128, 128, 1, 0, 8, 4.0)
    message = refused.value.message
    assert f"about {recorded['video-sdpa']:.0f} s here (estimated from the sampling times recorded for video-sdpa " \
           f"on a cpu (model_latency.json))" in message, message
    assert message.endswith(f"; mhla takes about {recorded['video-mhla']:.0f} s for it here"), message
    assert not any((tmp_path / "out").rglob("*.mp4"))                   # nothing ran


def test_a_long_comparison_on_a_cpu_is_refused_with_each_configurations_time_and_the_steps_that_fit(tmp_path):
    """Compare at 32 x 128 x 128 on a CPU: the softmax reference alone passes the bound, so the refusal names each
    configuration's estimate (softmax's beside MHLA's) and the steps at which the comparison fits."""
    from mediagen.app.bench_results import read_model_latency
    from mediagen.app.handlers import MediagenApp
    from mediagen.app.models import default_models

    models = default_models()
    models.video.served = dict(LONG)
    app = MediagenApp(models, device="cpu", output_dir=tmp_path / "out")
    recorded = {r["pipeline"]: r["s_per_clip"] for r in read_model_latency(app.model_results_path)
                if r["device"].startswith("cpu") and r["tokens_per_clip"] == 8192 and r["runtime"] == "eager"}
    sdpa, mhla = recorded["video-sdpa"], recorded["video-mhla"]
    with pytest.raises(gr.Error) as refused:
        app.compare("text-to-video", ["mhla · FlashAttention"], "the digit 3 moves left", None, 0, 8, 4.0, 32, 128, 128)
    message = refused.value.message
    assert message.startswith(f"steps=8: these 2 configurations would take about {sdpa + mhla:.0f} s here "
                              f"(sdpa · FlashAttention about {sdpa:.0f} s, mhla · FlashAttention about {mhla:.0f} s; "
                              f"estimated from the sampling times recorded for video-sdpa on a cpu"), message
    fit = int(90 // ((sdpa + mhla) / 8))                                # the recorded times hold no fixed part
    assert 1 <= fit < 8 and f"past this server's 90 s per request: use steps ≤ {fit}, fewer configurations" in message
    assert not any((tmp_path / "out").rglob("*.mp4"))


def test_each_checkpoint_samples_on_its_own_noise_schedule(tmp_path, monkeypatch):
    """A long-clip checkpoint's scheduler shifts with the token count (3 at 1,024 tokens, 8.5 at 8,192), as it
    trained; softmax's keeps a fixed shift. The app samples each attention with its own checkpoint's scheduler,
    not the base pipeline's (which at 8,192 tokens would sample the long model at shift 3)."""
    from mediagen.app import generation
    from mediagen.app.models import ModelCache, default_models
    from mediagen.models.presets import build_transformer, preset
    from mediagen.pipelines.schedulers import make_scheduler

    wan = preset("wan-tiny")
    wan["config"]["text_dim"] = 384                                   # MiniLM's width
    for label in ("mhla", "sdpa"):
        build_transformer(wan).save_pretrained(tmp_path / f"video-{label}")
        (tmp_path / f"video-{label}" / "card.json").write_text(json.dumps(
            {"default_for": ["text-to-video"]} if label == "mhla" else {}))
    make_scheduler("flow-euler", 3.0, max_shift=8.5, shift_seq_len=[1024, 8192]).save_pretrained(
        tmp_path / "video-mhla" / "scheduler")
    cache = ModelCache(default_models(tmp_path), device="cpu")
    own, base = cache.scheduler("video", "mhla"), cache.scheduler("video", "sdpa")
    assert own.config.use_dynamic_shifting and own.config.max_image_seq_len == 8192
    assert not base.config.use_dynamic_shifting and base.config.shift == 3.0
    assert cache.scheduler("video", "mhla") is not own                # a fresh one per request
    assert not cache.scheduler("video").config.use_dynamic_shifting   # no attention: the base pipeline's
    seen = []
    scheduler = ModelCache.scheduler
    monkeypatch.setattr(ModelCache, "scheduler", lambda self, family, attention=None: seen.append(
        (family, attention)) or scheduler(self, family, attention))
    out = generation.text_samples(cache, "mhla", "FlashAttention", "the digit 3 moves left", None, 1, 0, 2, 4.0,
                                  16, 16, 2)
    assert seen == [("video", "mhla")] and np.isfinite(out.samples).all()
    (tmp_path / "video-mhla" / "scheduler" / "scheduler_config.json").write_text(json.dumps({"_class_name": "os"}))
    with pytest.raises(ValueError, match=r"names _class_name='os', which is not a diffusers scheduler"):
        ModelCache(default_models(tmp_path), device="cpu").scheduler("video", "mhla")

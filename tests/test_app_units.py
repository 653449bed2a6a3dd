"""The app's pure parts: PSNR/SSIM against a direct implementation, limits, the Compare plan,
reading recorded benchmark tables, and the default model set."""

import math

import gradio as gr
import numpy as np
import pytest

from mediagen.app import bench_results, compare, files, limits, models, scores
from mediagen.app.similarity import psnr, ssim


def _ssim_direct(a, b):
    """SSIM by an explicit loop over Gaussian-weighted windows (reflect padding), one channel."""
    r = np.arange(11) - 5
    g = np.exp(-(r ** 2) / (2 * 1.5 ** 2))
    w = np.outer(g, g) / np.outer(g, g).sum()
    pa, pb = np.pad(a, 5, mode="reflect"), np.pad(b, 5, mode="reflect")
    c1, c2 = 0.01 ** 2, 0.03 ** 2
    vals = []
    for i in range(a.shape[0]):
        for j in range(a.shape[1]):
            x, y = pa[i:i + 11, j:j + 11], pb[i:i + 11, j:j + 11]
            mx, my = (w * x).sum(), (w * y).sum()
            vx, vy, cxy = (w * x * x).sum() - mx ** 2, (w * y * y).sum() - my ** 2, (w * x * y).sum() - mx * my
            vals.append((2 * mx * my + c1) * (2 * cxy + c2) / ((mx ** 2 + my ** 2 + c1) * (vx + vy + c2)))
    return float(np.mean(vals))


def test_ssim_matches_a_direct_window_loop():
    rng = np.random.default_rng(0)
    a = rng.random((20, 18, 1))
    b = np.clip(a + rng.normal(0, 0.1, a.shape), 0, 1)
    assert ssim(a, b) == pytest.approx(_ssim_direct(a[..., 0], b[..., 0]), rel=1e-9)
    assert ssim(a, a) == pytest.approx(1.0)
    assert ssim(a, rng.random(a.shape)) < 0.2


def test_psnr_and_ssim_on_videos_and_edges():
    a = np.full((3, 8, 8, 3), 0.5)
    b = a + 0.1
    assert psnr(a, b) == pytest.approx(20.0)                      # mse 0.01 -> 20 dB
    assert math.isinf(psnr(a, a))
    assert ssim(np.zeros((2, 4, 4, 1)), np.zeros((2, 4, 4, 1))) == pytest.approx(1.0)   # smaller than the window
    with pytest.raises(ValueError, match="different shapes"):
        psnr(a, a[:2])


def test_bounds_name_the_input_and_the_range():
    with pytest.raises(gr.Error, match=r"steps=60 is out of bounds: this server allows steps from 1 to 50"):
        limits.bounded_int("steps", 60, 1, 50)
    with pytest.raises(gr.Error, match="whole number"):
        limits.bounded_int("frames", 2.5, 1, 9)
    with pytest.raises(gr.Error, match="multiple of 4"):
        limits.bounded_side("width", 30, 4, limits.Limits())
    with pytest.raises(gr.Error, match="at most 500"):
        limits.bounded_prompt("x" * 501, limits.Limits())
    assert limits.bounded_int("batch", 2.0, 1, 4) == 2


def test_compare_plan_puts_the_reference_first_and_dedupes():
    chosen = [("mhla", "MLRA"), ("sdpa", "FlashAttention"), ("mhla", "MLRA"), ("mhla", "HLA")]
    assert compare.plan("text-to-video", chosen) == [("sdpa", "FlashAttention"), ("mhla", "MLRA"), ("mhla", "HLA")]
    assert compare.plan("class-to-image", chosen) == [("sdpa", "—"), ("mhla", "—")]
    assert compare.config_label("mhla", "HLA") == "mhla · HLA" and compare.config_label("mhla", "—") == "mhla"
    with pytest.raises(ValueError, match="not allowed"):
        compare.parse_config("mhla+HLA", models.ATTENTIONS, models.TEXT_ENCODERS)


RESULTS = """# Attention, H200 bf16

| shape | B | N | heads×d | method | fwd ms | fwd ms (CUDA graph) | floor ms |
|---|---|---|---|---|---|---|---|
| Wan 480p | 1 | 32760 | 12x128 | sdpa cudnn | 11.7 | 11.5 | 0.094 |
| Wan 480p | 1 | 32760 | 12x128 | mhla triton | **0.41** | 0.39 | 0.094 |
| Wan 720p | 1 | 75,600 | 12x128 | mhla triton | 0.9 | — | 0.2 |
| Wan 720p | 1 | 75600 | 12x128 | sdpa flash | — | — | 0.2 |

Some prose and an unrelated table:

| a | b |
|---|---|
| 1 | 2 |

## Whole model

| model | grid | N | attention | fwd ms | speed-up vs sdpa | note |
|---|---|---|---|---|---|---|
| wan2.1-1.3b | 21x30x52 | 32760 | sdpa | 619 | — | |
"""


def test_recorded_tables_are_parsed_and_labelled():
    rows = bench_results.parse_results(RESULTS)
    assert {"N": 75600, "method": "mhla triton [Attention, H200 bf16]", "fwd_ms": 0.9} in rows
    assert {"N": 32760, "method": "mhla triton [Attention, H200 bf16]", "fwd_ms": 0.41} in rows
    assert {"N": 32760, "method": "sdpa [Whole model]", "fwd_ms": 619.0} in rows
    assert len(rows) == 4                                          # the row without a time is skipped
    assert "| sdpa cudnn [Attention, H200 bf16] | 32760 | 11.700 |" in bench_results.markdown(rows)


def test_missing_results_file_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="no latency has been recorded"):
        bench_results.read_results(tmp_path / "RESULTS.md")
    (tmp_path / "RESULTS.md").write_text("no tables here\n")
    with pytest.raises(ValueError, match="no table"):
        bench_results.read_results(tmp_path / "RESULTS.md")


def test_default_models_pick_up_shipped_checkpoints(tmp_path):
    fresh = models.default_models(tmp_path)
    assert fresh.image.base == "dit-mnist" and fresh.video.base == "wan-mmnist" and not fresh.image.trained
    assert fresh.text_encoders == {"FlashAttention": "minilm", "MLRA": "minilm-mlra2", "HLA": "minilm-hla"}
    for folder in ("image-mhla", "video-sdpa", "text-hla"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "config.json").write_text("{}")
    shipped = models.default_models(tmp_path)
    assert shipped.image.trained == {"mhla": str(tmp_path / "image-mhla")}
    assert shipped.video.trained == {"sdpa": str(tmp_path / "video-sdpa")}
    assert shipped.text_encoders["HLA"] == str(tmp_path / "text-hla")


def test_digit_scores_recognise_real_digits():
    from mediagen.data import load_mnist10k

    images, labels = load_mnist10k()
    picks = np.flatnonzero(labels == 7)[:4]
    batch = np.repeat(images[picks, :, :, None] / 255.0, 2, axis=1)[:, ::2]          # any size works
    got = scores.digit_scores(batch, 7)
    assert got["predicted"] == 7 and got["digit_prob"] > 0.8
    assert scores.digit_scores(batch, 1)["digit_prob"] < 0.2
    assert scores.prompt_digit("a seven moving up") == 7 and scores.prompt_digit("a cat") is None


def test_old_request_folders_are_pruned(tmp_path):
    old = files.request_dir(tmp_path, "image")
    (old / "x.png").write_bytes(b"x")
    kept = files.request_dir(tmp_path, "video")
    new = files.request_dir(tmp_path, "image")
    assert old.exists() and kept.exists() and new.exists()
    import os
    os.utime(old, (0, 0))
    files.request_dir(tmp_path, "compare")
    assert not old.exists() and kept.exists()


def test_browser_set_up_fails_loudly_when_it_cannot_install(monkeypatch):
    import app_browser

    monkeypatch.setattr(app_browser, "find_chromium", lambda: None)
    monkeypatch.setattr(app_browser.os, "geteuid", lambda: 1000)
    with pytest.raises(app_browser.BrowserUnavailable, match="not running as root"):
        app_browser.install_chromium()
    monkeypatch.setattr(app_browser.os, "geteuid", lambda: 0)
    monkeypatch.setattr(app_browser, "_run", lambda cmd, timeout: type("R", (), {
        "returncode": 100, "stdout": "", "stderr": "E: Unable to locate package chromium"})())
    with pytest.raises(app_browser.BrowserUnavailable, match="Unable to locate package chromium"):
        app_browser.install_chromium()

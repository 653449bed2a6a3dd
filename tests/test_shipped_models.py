"""The checkpoints shipped in mediagen/checkpoints (trained on the H200, docs/RESULTS.md) are real:
their digits are recognised by the independent digit classifier, the video models denoise real
Moving-MNIST clips far better than random weights, read the caption's direction and move the digit as
asked, the distilled text encoders stay close to MiniLM, and everything together fits the 120 MB budget."""

import re

import numpy as np
import pytest
import torch

from benchmarks.time_reversal import OPPOSITE
from mediagen.eval.digit_classifier import classify_digits
from mediagen.pipelines import build_pipeline
from mediagen.pipelines.shipping import checkpoints_dir, shipped_checkpoint
from mediagen.text.encoders import load_minilm, load_text_encoder, make_prompts, sentence_similarity

IMAGE_MODELS = ("image-sdpa", "image-mhla", "image-linear")
VIDEO_MODELS = ("video-sdpa", "video-mhla")


def test_shipped_checkpoints_fit_the_budget():
    files = [p for p in checkpoints_dir().rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) <= 120 * 10**6
    assert all(p.suffix in (".json", ".safetensors") for p in files)        # no pickles


@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_shipped_digit_models_draw_the_digits_asked_for(name):
    assert shipped_checkpoint(name) is not None
    pipe = build_pipeline(name)
    pipe.set_progress_bar_config(disable=True)
    labels = list(range(10))
    images = pipe(class_labels=labels, num_inference_steps=10, guidance_scale=2.0, output_type="np",
                  generator=torch.Generator().manual_seed(0)).images
    pixels = (np.clip(images[..., 0], 0, 1) * 255).astype(np.uint8)
    accuracy = (classify_digits(pixels).numpy() == np.array(labels)).mean()
    assert accuracy >= 0.8, (name, accuracy)
    # and a random-weight model of the same preset does not (the test can fail)
    if name == "image-sdpa":
        torch.manual_seed(0)
        noise = build_pipeline("dit-mnist")
        noise.set_progress_bar_config(disable=True)
        rnd = noise(class_labels=labels, num_inference_steps=4, output_type="np",
                    generator=torch.Generator().manual_seed(0)).images
        rnd_pixels = (np.clip(rnd[..., 0], 0, 1) * 255).astype(np.uint8)
        assert (classify_digits(rnd_pixels).numpy() == np.array(labels)).mean() <= 0.5


def _flow_loss(pipe, clips, captions, sigma: float) -> float:
    """The training objective (velocity noise - x0 at noise level sigma) on real clips."""
    g = torch.Generator().manual_seed(1)
    noise = torch.randn(clips.shape, generator=g)
    x_t = (1.0 - sigma) * clips + sigma * noise
    embeds, _ = pipe.encode_prompt(captions, do_classifier_free_guidance=False, device=torch.device("cpu"),
                                   dtype=torch.float32)
    with torch.no_grad():
        pred = pipe.transformer(hidden_states=x_t, timestep=torch.full((len(clips),), sigma * 1000.0),
                                encoder_hidden_states=embeds, return_dict=False)[0]
    return float(torch.mean((pred.float() - (noise - clips)) ** 2))


@pytest.fixture(scope="module")
def real_clips():
    from mediagen.training.data.moving_mnist import MovingMNISTDataset

    data = MovingMNISTDataset(resolution=64, num_frames=16, split="held_out", seed=123)
    items = [data[i] for i in range(4)]
    return torch.stack([it["pixels"] for it in items]), [it["caption"] for it in items]


@pytest.mark.parametrize("name", VIDEO_MODELS)
def test_shipped_video_models_denoise_real_clips(name, real_clips):
    assert shipped_checkpoint(name) is not None
    clips, captions = real_clips
    pipe = build_pipeline(name)
    trained = [_flow_loss(pipe, clips, captions, s) for s in (0.4, 0.8)]
    torch.manual_seed(0)
    random = build_pipeline("wan-mmnist")  # same preset and MiniLM, random transformer weights
    untrained = [_flow_loss(random, clips, captions, s) for s in (0.4, 0.8)]
    # predicting zero scores E[(noise - x0)^2] ~ 1.2 here; the trained models reach ~0.1 or less
    assert all(t < 0.25 for t in trained), (name, trained)
    assert all(u > 4 * t for u, t in zip(untrained, trained)), (name, trained, untrained)
    # the caption's direction word matters: the loss under the opposite direction ("moves left" for a clip
    # that moves right) is higher (benchmarks.time_reversal over 24 clips: +0.46 for video-sdpa, +16 for
    # video-mhla; an MHLA model trained from scratch that ignored the word scored +0.000)
    flipped = [re.sub(r"\b(left|right|up|down)\b", lambda m: OPPOSITE[m[1]], c) for c in captions]
    gaps = [_flow_loss(pipe, clips, flipped, s) / t - 1 for s, t in zip((0.4, 0.8), trained)]
    assert all(gap > 0.05 for gap in gaps), (name, gaps)


def test_the_default_video_model_moves_the_digit_the_asked_way():
    """What a user asks for at the app's defaults (8 steps, guidance 4): one digit in each of the four
    directions, scored by the calibrated semantic scorer (docs/RESULTS.md). The default video model
    scores 1.00 on direction over 120 clips on the H200 (a model that ignores the direction word is caught
    by the caption check in the test above: four clips are too few to tell it by sampling). The default
    only: sampling costs about 50 s a model on a 2-core CPU."""
    from mediagen.eval.moving_mnist import score_clips
    from mediagen.pipelines.catalog import default_checkpoint

    name = default_checkpoint("text-to-video")
    pipe = build_pipeline(name)
    pipe.set_progress_bar_config(disable=True)
    prompts = [f"the digit 3 moves {d}" for d in ("left", "right", "up", "down")]
    clips = pipe(prompt=prompts, num_inference_steps=8, guidance_scale=4.0, output_type="np",
                 generator=torch.Generator().manual_seed(0)).frames
    verdicts = score_clips(np.asarray(clips, np.float32).mean(-1), prompts)
    assert sum(v["direction_ok"] for v in verdicts) >= 3, (name, [v["moved"] for v in verdicts])
    assert sum(v["digit_ok"] for v in verdicts) >= 3, (name, [v["read"] for v in verdicts])


def test_the_default_prompt_mode_model_draws_the_asked_digit():
    """Prompt-mode images as `mediagen generate --task text-to-image` draws them (the middle frame of a clip of
    the trained length, 8 steps, guidance 4), read by the shipped digit classifier. The default (video-sdpa, the
    cards' choice) draws the asked digit in 0.91 of 100 stills at 8 steps on the H200, 0.947 of 300 and 0.978 of 90
    on the CPU at the app's 16. Four digits, about 50 s on a 2-core CPU."""
    from mediagen.eval.moving_mnist import score_clips
    from mediagen.pipelines import TextToImagePipeline
    from mediagen.pipelines.catalog import default_checkpoint

    name = default_checkpoint("text-to-image")
    pipe = build_pipeline(name)
    still = TextToImagePipeline(**pipe.components)
    still.set_progress_bar_config(disable=True)
    prompts = [f"the digit {d}" for d in (0, 3, 5, 9)]
    images = still(prompt=prompts, num_inference_steps=8, guidance_scale=4.0, num_frames=16, output_type="np",
                   generator=torch.Generator().manual_seed(0)).images
    verdicts = score_clips(np.asarray(images, np.float32).mean(-1)[:, None], prompts)
    assert sum(v["digit_ok"] for v in verdicts) >= 3, (name, [v["read"] for v in verdicts])


@pytest.mark.parametrize("name", ["text-mlra", "text-hla"])
def test_shipped_text_encoders_stay_close_to_minilm(name):
    encoder = load_text_encoder(str(checkpoints_dir() / name))
    prompts = make_prompts(64, "heldout") + ["the digit 3 moves left", "the digit 8 moves down"]
    sim = sentence_similarity(encoder.model, load_minilm(), encoder.tokenizer, prompts)
    assert sim >= 0.9, (name, sim)


@pytest.mark.parametrize("attention", ["mhla", "sdpa"])
def test_app_serves_the_shipped_video_models(attention):
    from mediagen.app.generation import text_samples
    from mediagen.app.models import ModelCache, default_models

    models = default_models()
    assert models.video.trained[attention] == str(checkpoints_dir() / f"video-{attention}")
    cache = ModelCache(models, device=torch.device("cpu"))
    out = text_samples(cache, attention, "FlashAttention", "the digit 3 moves left", None, batch=1, seed=0, steps=2,
                       guidance=4.0, height=64, width=64, frames=4)
    assert out.is_video and out.samples.shape == (1, 4, 64, 64, 1) and np.isfinite(out.samples).all()

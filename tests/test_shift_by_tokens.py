"""A flow shift that follows the clip's token count (objective.max_shift): one rule in training and sampling.

Training draws sigma with shift(tokens); the exported scheduler is diffusers' dynamic shifting with the same
rule, so a pipeline samples a small clip with the small shift and a long one with the large shift."""

import json
import math
from types import SimpleNamespace

import pytest
import torch

from mediagen.pipelines import build_pipeline
from mediagen.pipelines.schedulers import latent_tokens, make_scheduler, shift_for_tokens, timestep_options
from mediagen.training import train
from mediagen.training.config import ConfigError
from mediagen.training.objectives import Objective
from training_helpers import TINY_WAN, tiny_config


def shifted(sigma, shift):
    return shift * sigma / (1 + (shift - 1) * sigma)


def test_rule_is_log_linear_in_tokens():
    assert shift_for_tokens(1024, 3.0, 8.5, (1024, 8192)) == pytest.approx(3.0)
    assert shift_for_tokens(8192, 3.0, 8.5, (1024, 8192)) == pytest.approx(8.5)
    assert shift_for_tokens(4608, 3.0, 8.5, (1024, 8192)) == pytest.approx(math.sqrt(3.0 * 8.5))
    assert shift_for_tokens(8192, 3.0, None) == 3.0
    assert shift_for_tokens(100, 3.0, 8.5, (1024, 8192)) == pytest.approx(3.0)      # held outside the range
    assert shift_for_tokens(10 ** 6, 3.0, 8.5, (1024, 8192)) == pytest.approx(8.5)
    assert latent_tokens((1, 8, 8), (2, 1, 32, 128, 128)) == 8192
    assert latent_tokens(2, (2, 4, 32, 32)) == 256


@pytest.mark.parametrize("tokens, shape", [(1024, (1, 1, 16, 64, 64)), (8192, (1, 1, 32, 128, 128))])
def test_scheduler_samples_each_size_with_its_shift(tokens, shape):
    sched = make_scheduler("flow-euler", 3.0, 8.5, (1024, 8192))
    sched.set_timesteps(8, **timestep_options(sched, SimpleNamespace(patch_size=(1, 8, 8)), shape))
    plain = torch.linspace(1.0, 1 / 1000, 8)
    expected = shifted(plain, shift_for_tokens(tokens, 3.0, 8.5, (1024, 8192)))
    assert torch.allclose(sched.sigmas[:-1], expected, atol=1e-5)
    assert timestep_options(make_scheduler("flow-euler", 3.0), SimpleNamespace(patch_size=(1, 8, 8)), shape) == {}
    with pytest.raises(ValueError, match="max_shift=8.5 is not allowed with scheduler='flow-unipc'"):
        make_scheduler("flow-unipc", 3.0, 8.5)


def test_training_sigma_uses_the_batch_token_count():
    cfg = SimpleNamespace(kind="flow", timestep_sampling="logit-normal", logit_mean=0.0, logit_std=1.0, shift=3.0,
                          max_shift=8.5, shift_seq_len=[1024, 8192], num_train_timesteps=1000, class_dropout=0.0)
    objective = Objective(cfg)
    x0 = torch.zeros(4, 1, 2, 4, 4)
    base = objective.noise(x0, 0, 5, [0, 1, 2, 3], tokens=1024).timesteps / 1000
    long = objective.noise(x0, 0, 5, [0, 1, 2, 3], tokens=8192).timesteps / 1000
    u = base / (3.0 - 2.0 * base)                      # the unshifted draw behind each sigma
    assert torch.allclose(long, shifted(u, 8.5), atol=1e-5)
    assert (long > base).all()
    assert torch.equal(objective.noise(x0, 0, 5, [0, 1, 2, 3]).timesteps / 1000, base)  # no count: objective.shift


def test_trained_pipeline_carries_the_rule(tmp_path, monkeypatch):
    out = tmp_path / "wan"
    counts = []
    noise = Objective.noise

    def recording(self, x0, seed, step, positions, tokens=None):
        counts.append(tokens)
        return noise(self, x0, seed, step, positions, tokens)

    monkeypatch.setattr(Objective, "noise", recording)
    train(tiny_config(out, TINY_WAN, "train.max_steps=1", "checkpoint.every=100", "objective.shift=3.0",
                      "objective.max_shift=6.0", "objective.shift_seq_len=[32,512]"))
    assert counts == [4 * 8 * 8]  # 4 frames of 16x16 pixels in (1, 2, 2) patches
    saved = json.loads((out / "pipeline" / "scheduler" / "scheduler_config.json").read_text())
    assert saved["use_dynamic_shifting"] is True
    assert saved["base_shift"] == pytest.approx(math.log(3.0)) and saved["max_shift"] == pytest.approx(math.log(6.0))
    assert (saved["base_image_seq_len"], saved["max_image_seq_len"]) == (32, 512)
    pipe = build_pipeline(str(out / "pipeline"))
    patch = pipe.transformer.config.patch_size
    seen = []
    for frames, side in ((4, 16), (8, 32)):
        pipe("the digit 3 moves left", height=side, width=side, num_frames=frames, num_inference_steps=3)
        seen.append(pipe.scheduler.sigmas[1].item())  # 3 steps: sigma 0.5005 before the shift
    tokens = [latent_tokens(patch, (1, 1, f, s, s)) for f, s in ((4, 16), (8, 32))]
    expected = [shifted(torch.tensor(0.5005), shift_for_tokens(n, 3.0, 6.0, (32, 512))).item() for n in tokens]
    assert seen == pytest.approx(expected, abs=1e-4) and seen[1] > seen[0]


@pytest.mark.parametrize("override, key", [("objective.max_shift=-1", "objective.max_shift"),
                                           ("objective.shift_seq_len=[64,16]", "objective.shift_seq_len")])
def test_bad_settings_name_the_key(tmp_path, override, key):
    extra = [] if "max_shift" in override else ["objective.max_shift=6.0"]
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        train(tiny_config(tmp_path / "x", TINY_WAN, "train.max_steps=1", override, *extra))

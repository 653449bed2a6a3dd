"""benchmarks/dit_images.py: the training-step mode trains (parameters move, Mc stays in [0, 1]) and prints a
timed row per variant."""

import re

import torch

import mediagen
from benchmarks import dit_images
from mediagen.attention import MHLAttention
from mediagen.models.presets import build_transformer


def test_training_step_updates_the_model_and_clips_mc():
    torch.manual_seed(0)
    model = build_transformer("dit-tiny").train()
    mediagen.convert(model, "mhla", blocks=[2, 2], reinit=True)
    mixes = [m.mix for m in model.modules() if isinstance(m, MHLAttention)]
    assert mixes
    with torch.no_grad():
        for mix in mixes:
            mix.fill_(1.0)  # at the clip's edge: a step that raises an entry leaves it clipped back to 1
    before = [p.detach().clone() for p in model.parameters()]
    cfg = model.config
    x = torch.randn(2, cfg.in_channels, cfg.sample_size, cfg.sample_size)
    step = dit_images.training_step(model, model, x, torch.full((2,), 500), torch.tensor([1, 2]))
    for _ in range(2):
        step()
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(float(m.min()) >= 0.0 and float(m.max()) <= 1.0 for m in mixes)


def test_prints_a_training_row_per_variant(capsys):
    dit_images.main(["--tiny", "--train", "--variants", "sdpa,mhla", "--modes", "eager"])
    out = capsys.readouterr().out
    assert "### DiT training step, 2 images" in out
    for variant in ("sdpa", "mhla"):
        row = re.search(rf"^\| dit-tiny \| 16 \| 2x2 \| {variant} \| eager \| ([\d.]+) \|", out, re.M)
        assert row is not None and float(row.group(1)) > 0, out

"""The small presets build, run one forward, and write as JSON; the large ones are only checked by config."""

import json

import pytest
import torch

from mediagen.models.presets import PRESETS, build_transformer, preset, write_preset_json


@pytest.mark.parametrize("name, shape", [("dit-s-mnist", (1, 1, 28, 28)), ("dit-s-cifar", (1, 3, 32, 32)),
                                         ("wan-mmnist", (1, 1, 2, 16, 16))])
def test_small_presets_build_and_run(name, shape):
    torch.manual_seed(0)
    model = build_transformer(name).eval()
    x = torch.randn(shape)
    with torch.no_grad():
        if name.startswith("dit"):
            out = model(x, timestep=torch.tensor([3]), class_labels=torch.tensor([9])).sample
        else:
            out = model(x, torch.tensor([3.0]), torch.randn(1, 4, 384)).sample
    assert out.shape == x.shape


def test_presets_are_plain_json(tmp_path):
    path = write_preset_json("wan-mmnist", tmp_path / "wan.json")
    assert json.loads(path.read_text()) == preset("wan-mmnist")
    assert preset("wan2.1-1.3b")["config"]["num_layers"] == 30
    assert set(PRESETS) >= {"dit-s-mnist", "wan-mmnist", "dit-xl-2-256", "wan2.1-1.3b"}
    with pytest.raises(ValueError, match="preset='nope' is not known"):
        preset("nope")

"""Each sample's noise, timestep and dropout depend only on (seed, step, position), on any device."""

import pytest
import torch

from mediagen.training import load_config
from mediagen.training.objectives import Objective


def _objective(kind="flow"):
    return Objective(load_config(None, ["output_dir=x", "model.preset=dit-tiny", f"objective.kind={kind}"]).objective)


def _devices():
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("kind", ["flow", "ddpm"])
def test_a_sample_sees_the_same_randomness_whatever_the_split(device, kind):
    obj = _objective(kind)
    x0 = torch.randn(4, 1, 3, 8, 8, device=device)
    whole = obj.noise(x0, seed=3, step=7, positions=[0, 1, 2, 3])
    half = obj.noise(x0[2:], seed=3, step=7, positions=[2, 3])
    assert whole.inputs.device.type == device
    assert torch.equal(whole.inputs[2:], half.inputs) and torch.equal(whole.target[2:], half.target)
    assert torch.equal(whole.timesteps[2:], half.timesteps) and torch.equal(whole.drop[2:], half.drop)
    other = obj.noise(x0, seed=3, step=8, positions=[0, 1, 2, 3])
    assert not torch.equal(whole.target, other.target)                 # a new step draws new noise
    assert len({round(float(t), 6) for t in whole.timesteps}) == 4     # and every sample its own


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the device generator path)")
def test_gpu_noise_does_not_depend_on_which_gpu():
    obj = _objective()
    a = obj.noise(torch.zeros(2, 1, 4, 4, device="cuda:0"), 0, 1, [0, 1]).target
    last = f"cuda:{torch.cuda.device_count() - 1}"
    b = obj.noise(torch.zeros(2, 1, 4, 4, device=last), 0, 1, [0, 1]).target
    assert torch.equal(a.cpu(), b.cpu())

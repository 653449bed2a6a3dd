"""CastRMSNorm (mediagen/models/norms.py): the training components' RMSNorms take their input's dtype
so that bf16 activations keep torch's fused kernel; values and gradients agree with torch.nn.RMSNorm."""

import warnings

import pytest
import torch

from mediagen.models.norms import CastRMSNorm, cast_rms_norms
from mediagen.training.components import build_components
from training_helpers import TINY_WAN, tiny_config


def _pair(width=48, seed=0):
    torch.manual_seed(seed)
    plain = torch.nn.RMSNorm(width, eps=1e-6)
    plain.weight.data.normal_(1.0, 0.2)
    holder = torch.nn.Sequential(torch.nn.RMSNorm(width, eps=1e-6))
    holder[0].weight.data.copy_(plain.weight.data)
    weight = holder[0].weight
    assert cast_rms_norms(holder) == 1
    assert type(holder[0]) is CastRMSNorm and holder[0].weight is weight   # the same parameter object
    assert list(holder.state_dict()) == ["0.weight"]
    return plain, holder[0]


def test_fp32_input_gives_the_same_values_and_gradients():
    plain, cast = _pair()
    x = torch.randn(5, 7, 48, requires_grad=True)
    y0, y1 = plain(x), cast(x)
    torch.testing.assert_close(y1, y0, rtol=0, atol=0)
    g = torch.randn_like(y0)
    gx0, gw0 = torch.autograd.grad(y0, (x, plain.weight), g)
    gx1, gw1 = torch.autograd.grad(y1, (x, cast.weight), g)
    torch.testing.assert_close(gx1, gx0)
    torch.testing.assert_close(gw1, gw0)


@pytest.fixture
def warn_always():
    """torch warns of the composite fallback once a process (TORCH_WARN_ONCE); every time while this runs."""
    before = torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    yield
    torch.set_warn_always(before)


def test_bf16_input_with_fp32_weight_stays_fused_and_close_to_the_composite(warn_always):
    plain, cast = _pair(seed=1)
    x = torch.randn(64, 48).to(torch.bfloat16).requires_grad_(True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y0 = plain(x)
    assert any("fused" in str(w.message) for w in caught)           # torch's composite fallback
    with warnings.catch_warnings():
        warnings.simplefilter("error")                                # no fallback warning
        y1 = cast(x)
    assert y1.dtype == torch.bfloat16 and cast.weight.dtype == torch.float32
    # the weight rounded to bf16 before the multiply: within a bf16 rounding step of the composite's output
    torch.testing.assert_close(y1.float(), y0.float(), rtol=1.6e-2, atol=1e-2)
    g = torch.randn(64, 48)
    gw0 = torch.autograd.grad(y0.float(), plain.weight, g)[0]
    gw1 = torch.autograd.grad(y1.float(), cast.weight, g)[0]
    assert gw1.dtype == torch.float32
    torch.testing.assert_close(gw1, gw0, rtol=2e-2, atol=2e-2)


def test_training_components_cast_every_rmsnorm_of_a_wan_model(tmp_path):
    comp = build_components(tiny_config(tmp_path, TINY_WAN))
    norms = [m for m in comp.transformer.modules() if isinstance(m, torch.nn.RMSNorm)]
    assert norms and all(type(m) is CastRMSNorm for m in norms)

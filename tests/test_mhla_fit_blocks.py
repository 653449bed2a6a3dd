"""MHLA on grids shorter than the trained block counts (a one-frame clip from the video model, a size
smaller than the one trained): blocks fitted per axis, Mc taken from the trained one; unchanged
wherever the trained blocks fit."""

import pytest
import torch
from models_fixtures import dit_inputs, tiny_dit, tiny_wan, wan_inputs

import mediagen
from mediagen.attention.mhla import MHLAttention, fit_blocks, fit_mix
from mediagen.kernels.mhla import mhla, mhla_reference


def _qkv(grid, heads=2, dim=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = torch.Size(grid).numel()
    return [torch.randn(1, n, heads, dim, generator=g) for _ in range(3)]


def _trained_layer(blocks, heads=None, seed=0):
    layer = MHLAttention(blocks, heads=heads)
    with torch.no_grad():
        layer.mix.uniform_(0, 1, generator=torch.Generator().manual_seed(seed))   # far from its init
    return layer


def test_fit_blocks_caps_each_axis_at_its_length():
    assert fit_blocks((2, 4, 4), (1, 8, 8)) == (1, 4, 4)
    assert fit_blocks((4, 2, 2), (16, 1, 3)) == (4, 1, 2)
    assert fit_blocks((3, 3), (7, 7)) == (3, 3)


def test_fitted_mix_is_the_first_slab_with_trained_row_sums():
    layer = _trained_layer((2, 3))
    mix = layer.mix.detach()
    got = fit_mix(mix, (2, 3), (1, 2))                     # keep blocks (0, 0) and (0, 1): ids 0, 1
    sub = mix[[0, 1]][:, [0, 1]]
    torch.testing.assert_close(got, sub * (mix[[0, 1]].sum(1, keepdim=True) / sub.sum(1, keepdim=True)))
    torch.testing.assert_close(got.sum(1), mix[[0, 1]].sum(1))
    assert fit_mix(mix, (2, 3), (2, 3)) is mix
    per_head = _trained_layer((2, 2, 2), heads=3).mix.detach()
    assert fit_mix(per_head, (2, 2, 2), (1, 2, 2)).shape == (3, 4, 4)


@pytest.mark.parametrize("heads", [None, 2])
def test_one_frame_grid_runs_as_the_first_temporal_slab(heads):
    """blocks (2, 2, 2) on a one-frame grid (1, 4, 4): before, an error (blocks[0]=2 > grid[0]=1).
    With eps = 0 the result is the trained layout's MHLA with the later blocks empty: the sub-matrix
    of Mc without any rescale (the rescale cancels in the normalised output)."""
    layer = _trained_layer((2, 2, 2), heads=heads)
    layer.eps = 0.0
    q, k, v = _qkv((1, 4, 4))
    out = layer(q, k, v, (1, 4, 4))
    idx = torch.tensor([0, 1, 2, 3])                       # blocks (0, j, l)
    sub = layer.mix.detach().index_select(-2, idx).index_select(-1, idx)
    expected = mhla_reference(q, k, v, sub, (1, 4, 4), (1, 2, 2), eps=0.0, feature_map="relu")
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


def test_trained_blocks_that_fit_give_identical_results():
    layer = _trained_layer((2, 2, 2))
    q, k, v = _qkv((3, 4, 4))
    out = layer(q, k, v, (3, 4, 4))
    same = mhla(q, k, v, layer.mix, (3, 4, 4), (2, 2, 2), normalize=True, eps=layer.eps, feature_map="relu")
    assert torch.equal(out, same)


def test_wan_mhla_runs_one_frame_and_small_sizes():
    model = mediagen.convert(tiny_wan(num_layers=2), "mhla", blocks=[2, 2, 2], rope="features", out_norm=True)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2 and p.shape == (8, 8):
                p.uniform_(0, 1)
        for frames, height, width in ((1, 8, 8), (3, 2, 8), (1, 2, 2)):   # grids (1,4,4), (3,1,4), (1,1,1)
            out = model(**wan_inputs(batch=1, frames=frames, height=height, width=width)).sample
            assert out.shape == (1, 1, frames, height, width) and torch.isfinite(out).all()
        fits = wan_inputs(batch=1, frames=3, height=8, width=8)
        before = model(**fits).sample
        for m in model.modules():
            if isinstance(m, MHLAttention):
                assert m.blocks == (2, 2, 2)                 # the trained layout is kept, not changed
        assert torch.equal(model(**fits).sample, before)


def test_dit_mhla_runs_below_its_trained_grid():
    model = mediagen.convert(tiny_dit(num_layers=2), "mhla", blocks=[4, 4])
    with torch.no_grad():
        out = model(**dit_inputs(batch=1, side=4)).sample       # a 2x2 token grid
    assert out.shape[-2:] == (4, 4) and torch.isfinite(out).all()


def test_a_one_dimensional_layer_takes_an_int_grid_as_the_op_does():
    """The op reads grid=12 as the 1-D grid (12,); the layer over it does the same instead of failing to
    iterate an int."""
    torch.manual_seed(0)
    layer = MHLAttention((3,), heads=2)
    q, k, v = (torch.randn(1, 12, 2, 16) for _ in range(3))
    assert torch.equal(layer(q, k, v, 12), layer(q, k, v, (12,)))

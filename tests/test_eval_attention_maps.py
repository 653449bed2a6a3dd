"""Attention rank and entropy: dense matrices of softmax, linear and MHLA layers."""

import math

import pytest
import torch

from mediagen.attention import LinearAttention, MHLAttention, SDPAttention
from mediagen.eval.attention_maps import (AttentionRecorder, attention_entropy, attention_matrix, attention_rank,
                                          attention_stats, linear_attention_matrix, mhla_attention_matrix,
                                          softmax_attention_matrix)
from mediagen.kernels import mhla_reference


def _qkv(n, d, heads=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, n, heads, d, generator=g, dtype=torch.float64) for _ in range(3)]


def test_softmax_random_full_rank():
    q, k, _ = _qkv(64, 64)
    A = softmax_attention_matrix(q, k)
    assert torch.allclose(A.sum(-1), torch.ones(1, 2, 64, dtype=torch.float64))
    assert attention_rank(A).tolist() == [[64, 64]]


def test_linear_rank_at_most_head_dim():
    n, d = 64, 8
    q, k, v = _qkv(n, d)
    A = linear_attention_matrix(q, k, "elu1")
    ranks = attention_rank(A)
    assert (ranks <= d).all() and (ranks >= d - 1).all(), ranks
    # the dense matrix is the layer: A @ v equals global linear attention (MHLA with one block)
    want = mhla_reference(q, k, v, torch.ones(1, 1, dtype=torch.float64), (n,), (1,), feature_map="elu1")
    assert torch.allclose((A @ v.transpose(1, 2)).transpose(1, 2), want, atol=1e-9)
    layer = LinearAttention(feature_map="elu1")
    assert torch.allclose(attention_matrix(layer, q, k), A)


def test_mhla_matrix_is_the_layer_and_rank_between_d_and_md():
    grid, blocks, d = (8, 8), (2, 2), 4
    q, k, v = _qkv(64, d, seed=1)
    layer = MHLAttention(blocks).double()
    A = attention_matrix(layer, q, k, grid)
    want = mhla_reference(q, k, v, layer.mix.detach(), grid, blocks, feature_map="relu")
    assert torch.allclose((A @ v.transpose(1, 2)).transpose(1, 2), want, atol=1e-9)
    ranks = attention_rank(A, rtol=1e-10)
    assert (ranks > d).all() and (ranks <= 4 * d).all(), ranks
    # softmax > MHLA > linear on the same q, k, as the paper's ordering
    lin = attention_rank(linear_attention_matrix(q, k, "relu"), rtol=1e-10)
    soft = attention_rank(softmax_attention_matrix(q, k), rtol=1e-10)
    assert (lin < ranks).all() and (ranks < soft).all()


def test_entropy_uniform_and_one_hot():
    n = 16
    uniform = torch.full((1, 1, n, n), 1.0 / n)
    assert attention_entropy(uniform).item() == pytest.approx(math.log(n))
    assert attention_entropy(torch.eye(n)[None, None]).item() == pytest.approx(0.0, abs=1e-12)
    q, k, _ = _qkv(32, 8)
    s = attention_stats(softmax_attention_matrix(q, k))
    assert 0 < s["entropy_mean"] < math.log(32) and s["tokens"] == 32


def test_per_head_mix_and_bad_grid():
    q, k, _ = _qkv(16, 4, heads=3)
    mix = torch.rand(3, 4, 4, dtype=torch.float64)
    A = mhla_attention_matrix(q, k, mix, (4, 4), (2, 2))
    assert A.shape == (1, 3, 16, 16)
    with pytest.raises(ValueError, match="grid"):
        mhla_attention_matrix(q, k, mix, (4, 5), (2, 2))


def test_recorder_collects_layers_of_a_model():
    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.soft, self.mhla = SDPAttention(), MHLAttention((2, 2))

        def forward(self, q, k, v, grid):
            return self.mhla(self.soft(q, k, v, grid), k, v, grid)

    model = Tiny()
    q, k, v = (t.float() for t in _qkv(16, 16))
    with AttentionRecorder(model) as rec:
        model(q, k, v, (4, 4))
    stats = rec.stats()
    assert set(stats) == {"soft", "mhla"}
    assert stats["soft"]["rank_mean"] == 16


def test_recorder_on_a_converted_diffusers_model():
    """A hybrid DiT (softmax layer 0, MHLA layer 1) on a real digit: both layers are recorded, and
    the MHLA layer is the one with lower rank than softmax."""
    from mediagen.data import load_mnist10k
    from mediagen.models.convert import convert
    from mediagen.models.presets import build_transformer

    torch.manual_seed(0)
    model = build_transformer("dit-tiny", sample_size=16).eval()
    convert(model, ["sdpa", "mhla"], blocks=(2, 2))
    digit = torch.from_numpy(load_mnist10k("held_out")[0][0][6:22, 6:22]).float()[None, None] / 127.5 - 1
    with AttentionRecorder(model) as rec, torch.no_grad():
        model(digit, timestep=torch.tensor([500]), class_labels=torch.tensor([0]))
    stats = rec.stats(rtol=1e-8)
    kinds = {s["kind"] for s in stats.values()}
    assert kinds == {"softmax", "MHLAttention"}, stats.keys()
    assert all(s["tokens"] == 64 for s in stats.values())
    soft = next(s for s in stats.values() if s["kind"] == "softmax")
    mh = next(s for s in stats.values() if s["kind"] == "MHLAttention")
    assert mh["rank_mean"] < soft["rank_mean"] and mh["rank_mean"] <= 4 * 16  # M * d bounds MHLA's rank
    torch.nn.functional.scaled_dot_product_attention(q := torch.randn(1, 1, 4, 16), q, q)  # unpatched again


def test_attention_stats_command(tmp_path):
    import json

    from mediagen.cli import main

    out = tmp_path / "stats.json"
    assert main(["attention-stats", "--checkpoint", "dit-tiny", "--attention", "linear", "--out", str(out)]) == 0
    layers = json.loads(out.read_text())["layers"]
    assert len(layers) == 2 and all(s["kind"] == "LinearAttention" for s in layers.values())
    assert all(s["rank_mean"] <= 16 for s in layers.values())  # head dim 16 bounds linear attention's rank


def test_attention_stats_video_clip_size(tmp_path):
    import json

    from mediagen.cli import main
    from mediagen.eval.attention_stats_cli import real_input
    from mediagen.models import build_transformer

    model = build_transformer("wan-tiny")
    x = real_input(model, frames=5, side=16)["hidden_states"]
    assert x.shape == (1, 1, 5, 16, 16)
    out = tmp_path / "stats.json"
    # wan-tiny patches (1, 2, 2): 5 x 8 x 8 = 320 tokens per layer
    assert main(["attention-stats", "--checkpoint", "wan-tiny", "--frames", "5", "--size", "16", "--out", str(out)]) == 0
    assert all(s["tokens"] == 320 for s in json.loads(out.read_text())["layers"].values())
    with pytest.raises(ValueError, match="--size 8"):
        real_input(model, frames=5, side=8)


def _random_rotation(n, d, seed):
    """RoPE-like tables (cos, sin) (N, D/2): channel pairs of token t rotate by t-dependent angles."""
    g = torch.Generator().manual_seed(seed)
    angle = torch.rand(n, d // 2, generator=g) * 6.3
    return angle.cos(), angle.sin()


@pytest.mark.parametrize("per_head", [False, True])
def test_rotated_mhla_matrix_is_the_layer(per_head):
    """With RoPE on the features, A @ v is what the MHLA module computes with the same ``rope``
    (numerator rotated, denominator not), and the matrix has signed entries: no entropy."""
    grid, blocks, d, heads = (4, 6), (2, 3), 16, 2
    q, k, v = _qkv(24, d, heads=heads, seed=3)
    q, k, v = (t.float() for t in (q, k, v))  # the module runs the kernel path (fp32); the matrix is fp64
    layer = MHLAttention(blocks, heads=heads if per_head else None)
    with torch.no_grad():
        layer.mix.uniform_(0.1, 1.0)
    rope = _random_rotation(24, d, seed=4)
    A = attention_matrix(layer, q, k, grid, rope)
    got = (A @ v.double().transpose(1, 2)).transpose(1, 2)
    torch.testing.assert_close(got.float(), layer(q, k, v, grid, rope=rope), rtol=1e-4, atol=1e-5)
    assert not torch.allclose(A, attention_matrix(layer, q, k, grid))  # the rotation matters
    s = attention_stats(A)
    assert (A < 0).any() and s["entropy_mean"] is None and s["rank_mean"] <= 6 * d
    lin = LinearAttention(2)
    got = (attention_matrix(lin, q, k, grid, rope) @ v.double().transpose(1, 2)).transpose(1, 2)
    torch.testing.assert_close(got.float(), lin(q, k, v, grid, rope=rope), rtol=1e-4, atol=1e-5)


def test_recorder_records_rope_feature_layers(tmp_path):
    """A Wan model converted with rope='features' (the shipped video models): every MHLA layer is
    recorded with its rotation, and the recorded matrix reproduces the layer's attention output."""
    from mediagen.models.convert import convert
    from mediagen.models.presets import build_transformer
    from mediagen.eval.attention_stats_cli import real_input

    torch.manual_seed(0)
    model = build_transformer("wan-tiny").eval()
    convert(model, "mhla", blocks=(1, 2, 2), rope="features")
    inputs = real_input(model, frames=3, side=16)
    outs = {}
    hooks = [m.register_forward_hook(lambda mod, a, kw, o, n=n: outs.__setitem__(n, (a, kw, o)), with_kwargs=True)
             for n, m in model.named_modules() if isinstance(m, MHLAttention)]
    with AttentionRecorder(model) as rec, torch.no_grad():
        model(**inputs, return_dict=False)
    for h in hooks:
        h.remove()
    stats = rec.stats()
    assert stats and set(stats) == set(outs)
    assert all(s["kind"] == "MHLAttention+rope" and s["tokens"] == 3 * 8 * 8 for s in stats.values())
    name, (args, kw, out) = next(iter(outs.items()))
    mod, q, k, grid, rope = rec.records[name]
    A = attention_matrix(mod, q, k, grid, rope).float()
    v = args[2].float()
    torch.testing.assert_close((A @ v.transpose(1, 2)).transpose(1, 2), out.float(), rtol=1e-3, atol=1e-4)

"""MLRA-2 / MLRA-4: shapes and scalings as specified, an independent per-branch oracle, decoding
with the latent cache equal to the full forward, masks, and the short-sequence path equal to the long
one (forward and gradients)."""

import math

import pytest
import torch

from mediagen.text.attention.mlra import MLRAttention
from text_paths import assert_close_fp32, padding_mask, short_and_long


pytestmark = pytest.mark.usefixtures("one_thread")


D, H = 64, 4


def make(branches, **kw):
    torch.manual_seed(0)
    m = MLRAttention(D, H, branches=branches, **kw).double()
    torch.nn.init.normal_(m.out_proj.weight, std=0.1)                 # zero-init would hide errors
    for norm in m.kv_norms:
        torch.nn.init.uniform_(norm.weight, 0.5, 1.5)
    return m


def oracle(m: MLRAttention, x):
    """MLRA written out branch by branch, head by head, from the module's weights."""
    b, n, _ = x.shape
    dh, dr, dl = m.head_dim, m.rope_dim, m.latent_dim
    pos = torch.arange(n, dtype=torch.float64)
    inv = 10000.0 ** (-torch.arange(0, dr, 2, dtype=torch.float64) / dr)
    ang = pos[:, None] * inv
    cos, sin = ang.cos(), ang.sin()

    def rot(t):                                                        # t (B, N, dr)
        t1, t2 = t[..., : dr // 2], t[..., dr // 2:]
        return torch.cat([t1 * cos - t2 * sin, t1 * sin + t2 * cos], -1)

    cq = m.q_down(x)
    cq = cq / cq.pow(2).mean(-1, keepdim=True).add(m.q_norm.eps).sqrt() * m.q_norm.weight * math.sqrt(D / m.q_latent)
    q = m.q_up(cq).view(b, n, H, dh + dr)
    kv = m.kv_down(x)
    lat = [kv[..., i * dl:(i + 1) * dl] for i in range(4)]
    lat = [c / c.pow(2).mean(-1, keepdim=True).add(m.kv_norms[i].eps).sqrt() * m.kv_norms[i].weight
           * math.sqrt(4 * D / m.kv_latent) for i, c in enumerate(lat)]
    k_rope = rot(kv[..., m.kv_latent:])
    up = m.kv_up.view(4, dl, m.heads_per_latent, 2, dh)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    out = torch.zeros(b, n, H, dh, dtype=x.dtype)
    for branch in range(m.branches):
        for h in range(H):
            if m.branches == 4:
                latent, col = branch, h
            else:                                                      # MLRA-2: latents (2b, 2b+1) split the heads
                latent, col = 2 * branch + (h >= H // 2), h % (H // 2)
            k = torch.cat([lat[latent] @ up[latent, :, col, 0], k_rope], -1)
            v = lat[latent] @ up[latent, :, col, 1]
            qh = torch.cat([q[:, :, h, :dh], rot(q[:, :, h, dh:])], -1)
            s = (qh @ k.transpose(1, 2)) / math.sqrt(dh + dr)
            p = torch.softmax(s.masked_fill(~causal, -math.inf), -1)
            out[:, :, h] += (p @ v) / math.sqrt(m.branches)
    return m.out_proj(out.flatten(-2))


@pytest.mark.parametrize("branches", [2, 4])
def test_shapes_and_scalings(branches):
    m = MLRAttention(D, H, branches=branches)
    dh = D // H
    assert m.latent_dim == m.kv_latent // 4 == dh                     # d_c = 4 d_h by default
    assert m.rope_dim == dh // 2
    assert m.q_scale == pytest.approx(math.sqrt(D / m.q_latent))
    assert m.kv_scale == pytest.approx(math.sqrt(4 * D / m.kv_latent))
    assert m.branch_scale == pytest.approx(0.5 if branches == 4 else 1 / math.sqrt(2))
    hp = H if branches == 4 else H // 2
    assert m.kv_up.shape == (4, dh, hp * 2 * dh)
    assert len(m.kv_norms) == 4 and all(n.normalized_shape == (dh,) for n in m.kv_norms)
    assert torch.count_nonzero(m.out_proj.weight) == 0                # zero-initialised output
    x = torch.randn(2, 5, D)
    assert m(x).shape == (2, 5, D) and torch.count_nonzero(m(x)) == 0
    # cache: 4.5 d_h values per token and layer, bf16 = 2 bytes each
    assert m.kv_cache_bytes_per_token(torch.bfloat16) == int(4.5 * dh) * 2
    assert m.kv_cache_bytes_per_token(torch.bfloat16, tensor_parallel=4) == int(1.5 * dh) * 2
    cache = m.new_cache(1, 8, dtype=torch.bfloat16)
    assert cache.nbytes_per_token() == m.kv_cache_bytes_per_token(torch.bfloat16)


@pytest.mark.parametrize("branches", [2, 4])
def test_forward_matches_branchwise_oracle(branches):
    m = make(branches)
    x = torch.randn(2, 7, D, dtype=torch.float64)
    torch.testing.assert_close(m(x), oracle(m, x), rtol=1e-10, atol=1e-10)


def test_mlra2_and_mlra4_differ():
    x = torch.randn(1, 6, D, dtype=torch.float64)
    assert not torch.allclose(make(2)(x), make(4)(x))


@pytest.mark.parametrize("branches", [2, 4])
def test_latent_heads_have_their_own_norm(branches):
    """Scaling one latent head's down-projection leaves the output unchanged (its own RMSNorm)."""
    m = make(branches, eps=1e-30)
    x = torch.randn(1, 6, D, dtype=torch.float64)
    ref = m(x)
    with torch.no_grad():
        m.kv_down.weight[m.latent_dim: 2 * m.latent_dim] *= 7.0
    torch.testing.assert_close(m(x), ref, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("branches", [2, 4])
def test_decode_with_latent_cache_equals_full_forward(branches):
    m = make(branches)
    with torch.no_grad():  # distinct per-latent norm weights, so a mixed-up latent head would show
        for norm in m.kv_norms:
            norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 9, D, dtype=torch.float64)
    full = m(x)
    cache = m.new_cache(2, 16)
    steps = torch.cat([m(x[:, t:t + 1], cache=cache) for t in range(9)], dim=1)
    torch.testing.assert_close(steps, full, rtol=1e-10, atol=1e-10)
    assert set(cache.buffers) == {"latents", "rope_keys"}             # latents only, no K/V
    cache = m.new_cache(2, 16)
    pre = m(x[:, :4], cache=cache)
    rest = [m(x[:, t:t + 1], cache=cache) for t in range(4, 9)]
    torch.testing.assert_close(torch.cat([pre, *rest], 1), full, rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="capacity"):
        small = m.new_cache(2, 2)
        m(x[:, :3], cache=small)


@pytest.mark.parametrize("branches", [2, 4])
def test_padding_does_not_change_real_tokens(branches):
    m = make(branches)
    x = torch.randn(1, 5, D, dtype=torch.float64)
    ref = m(x)
    # right padding: causal attention never sees it
    xr = torch.cat([x, torch.randn(1, 3, D, dtype=torch.float64)], 1)
    mask = torch.tensor([[1] * 5 + [0] * 3])
    torch.testing.assert_close(m(xr, attention_mask=mask)[:, :5], ref)
    # left padding through an explicit mask (positions shift, so pass the real positions)
    xl = torch.cat([torch.randn(1, 3, D, dtype=torch.float64), x], 1)
    mask = torch.tensor([[0] * 3 + [1] * 5])
    pos = torch.tensor([0, 0, 0, 0, 1, 2, 3, 4])
    torch.testing.assert_close(m(xl, attention_mask=mask, positions=pos)[:, 3:], ref)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="branches"):
        MLRAttention(D, H, branches=3)
    with pytest.raises(ValueError, match="even number of heads"):
        MLRAttention(60, 3, branches=2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_tables_equal_apply_rope_bit_for_bit(dtype):
    from mediagen.text.attention.rope import apply_rope, apply_rope_tables, rope_cos_sin, rope_tables

    x = torch.randn(3, 7, 4, 16).to(dtype)
    pos = torch.randint(0, 5000, (7,))
    cos, sin = rope_cos_sin(pos, 16, dtype=dtype)
    cos_full, sin_signed = rope_tables(pos, 16, dtype=dtype)
    assert torch.equal(apply_rope_tables(x, cos_full[:, None], sin_signed[:, None]),
                       apply_rope(x, cos[:, None], sin[:, None]))


# ---- the short path (absorbed form for short sequences) against the long path ----

def make_random(branches, dtype=torch.float32, seed=0):
    """An MLRA layer whose every weight is random (biases, norm weights, output projection), so a
    weight folded into the wrong place shows."""
    torch.manual_seed(seed)
    m = MLRAttention(D, H, branches=branches, bias=True).to(dtype)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
        for norm in (m.q_norm, *m.kv_norms):                          # distinct per latent head
            norm.weight.uniform_(0.5, 1.5)
    return m


@pytest.mark.parametrize("branches", [2, 4])
@pytest.mark.parametrize("n", [1, 7, 16, 17, 40])
@pytest.mark.parametrize("batch,mask_kind", [(1, "none"), (3, "none"), (3, "right"), (2, "left"), (3, "holes")])
def test_short_path_equals_long_path_forward_and_gradients(branches, n, batch, mask_kind):
    """Fresh random inputs below and above a threshold of 16 tokens (each path forced): the same
    outputs and the same gradients for the input and every parameter, to fp32 rounding."""
    m = make_random(branches, seed=n)
    m.short_max_tokens = 16
    seed = 100 * n + batch
    x = torch.randn(batch, n, D, generator=torch.Generator().manual_seed(seed))
    mask = padding_mask(batch, n, mask_kind, seed)
    weight = torch.randn(batch, n, D, generator=torch.Generator().manual_seed(seed + 1))
    results = short_and_long(m, x, mask, weight)
    (short, gx_s, gp_s), (long, gx_l, gp_l) = results
    assert long.abs().max() > 0.1                                     # not a vacuous comparison
    assert_close_fp32(short, long, "output")
    assert_close_fp32(gx_s, gx_l, "input gradient")
    # a gradient that is 0 in exact arithmetic (the query's, with one key to attend to) is rounding
    # noise on both paths: compare it against the size of the layer's gradients, not its own
    floor = 2e-5 * max(g.norm().item() for g in gp_l.values())
    for name in gp_l:
        assert_close_fp32(gp_s[name], gp_l[name], f"gradient of {name}", floor=floor)


@pytest.mark.parametrize("branches", [2, 4])
def test_short_path_with_positions_and_without_causality(branches):
    m = make_random(branches, torch.float64)
    x = torch.randn(2, 9, D, dtype=torch.float64)
    pos = torch.tensor([0, 0, 0, 0, 1, 2, 3, 4, 5])
    mask = torch.tensor([[0] * 3 + [1] * 6, [1] * 9])
    torch.testing.assert_close(m._forward_short(x, mask, pos), m._forward_long(x, mask, pos), rtol=1e-10, atol=1e-10)
    m.causal = False
    for mk in (None, mask):
        torch.testing.assert_close(m._forward_short(x, mk), m._forward_long(x, mk), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("branches", [2, 4])
def test_short_path_dispatch(branches, monkeypatch):
    """forward takes the short path up to short_max_tokens tokens without a cache, else the long one."""
    from mediagen.text.attention import mlra

    m = make(branches)
    assert m.short_max_tokens == mlra.SHORT_MAX_TOKENS >= 512
    calls = []
    monkeypatch.setattr(m, "_forward_short", lambda *a, **k: calls.append("short"))
    monkeypatch.setattr(m, "_forward_long", lambda *a, **k: calls.append("long"))
    m.short_max_tokens = 8
    m(torch.randn(1, 8, D, dtype=torch.float64))
    m(torch.randn(1, 9, D, dtype=torch.float64))
    m(torch.randn(1, 4, D, dtype=torch.float64), cache=m.new_cache(1, 8))     # prefill into a cache
    m.short_max_tokens = 0
    m(torch.randn(1, 1, D, dtype=torch.float64))
    assert calls == ["short", "long", "long", "long"]
    with pytest.raises(ValueError, match="short_max_tokens=-1"):
        MLRAttention(D, H, branches=branches, short_max_tokens=-1)


def test_short_path_follows_parameter_changes():
    """The short path's folded weights are cached for inference; an in-place update, a cast or a
    change of a norm weight must reach the next call."""
    m = make_random(2, torch.float64)
    x = torch.randn(2, 6, D, dtype=torch.float64)
    with torch.no_grad():
        before = m(x)
        m.kv_norms[3].weight.mul_(2.0)
        m.q_up.bias.add_(0.5)
        after = m(x)
        assert not torch.allclose(before, after)
        torch.testing.assert_close(after, m._forward_long(x), rtol=1e-10, atol=1e-10)
        m.float()
        torch.testing.assert_close(m(x.float()), m._forward_long(x.float()), rtol=1e-5, atol=1e-5)


def test_short_path_follows_swapped_parameters_and_submodules():
    """The cached weights also follow a parameter or a submodule replaced by one made before the cache
    (no new tensor is created then, and nothing changes in place), and copies of the layer rebuild theirs."""
    import copy

    m = make_random(2, torch.float64)
    x = torch.randn(2, 6, D, dtype=torch.float64)
    other = torch.nn.Linear(m.q_down.in_features, m.q_down.out_features, bias=False, dtype=torch.float64)
    bias = torch.nn.Parameter(torch.randn_like(m.q_up.bias))
    with torch.no_grad():
        m(x)
        m.q_down = other
        torch.testing.assert_close(m(x), m._forward_long(x), rtol=1e-10, atol=1e-10)
        m.q_up.bias = bias
        torch.testing.assert_close(m(x), m._forward_long(x), rtol=1e-10, atol=1e-10)
        m.float()   # a cast there and back without a call between: fp64 weights rounded through fp32
        m.double()
        torch.testing.assert_close(m(x), m._forward_long(x), rtol=1e-10, atol=1e-10)
        twin = copy.deepcopy(m)
        twin.kv_norms[1].weight.mul_(3.0)
        torch.testing.assert_close(twin(x), twin._forward_long(x), rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(m(x), m._forward_long(x), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("branches", [2, 4])
def test_short_path_in_bfloat16(branches):
    m = make_random(branches, torch.bfloat16).eval()
    x = torch.randn(2, 11, D).bfloat16()
    mask = torch.tensor([[1] * 11, [1] * 6 + [0] * 5])
    with torch.no_grad():
        for mk in (None, mask):
            short, long = m._forward_short(x, mk), m._forward_long(x, mk)
            assert short.dtype == torch.bfloat16
            assert_close_fp32(short, long, "bf16 output", tol=3e-2)

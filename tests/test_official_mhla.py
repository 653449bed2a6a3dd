"""The official MHLA code's conventions (github DAGroup-PKU/MHLA) as options, and its checkpoints loaded.

Every convention is checked against a dense fp64 formula written here from its definition (token pairs, no
blocks), on the CPU paths and through the Triton kernels (interpreted on CPU tensors), forward and gradients.
The official layers themselves are re-written here from the published code (plain PyTorch, block-major
einsums), with the official parameter names: our layer matches them to 1e-15 in fp64, and a small official Wan
and DiT, mapped by ``load_official_state_dict``, match their diffusers conversions to 1e-5 in fp32.
"""

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mediagen
from mediagen.attention.mhla import MHLAttention, locality_mix, mhla_attend, official_locality_mix
from mediagen.models import load_transformer
from mediagen.models.attention_spec import AttentionSpec
from mediagen.models.official import load_official_state_dict, official_options, use_official_timesteps
from models_fixtures import tiny_dit, tiny_wan

# --- dense fp64 formulas of each convention ----------------------------------------------------------------


def blocks_and_positions(grid, blocks):
    """Per token (row-major grid order): its block (row-major over the block grid) and its position inside
    the block (row-major over the block's own extent), from the rule block j of an axis of length L cut into
    b spans [floor(j L / b), floor((j + 1) L / b))."""
    spans = [[range(j * L // b, (j + 1) * L // b) for j in range(b)] for L, b in zip(grid, blocks)]
    block, position = [], []
    for token in itertools.product(*(range(L) for L in grid)):
        j = [next(a for a, s in enumerate(axis) if x in s) for x, axis in zip(token, spans)]
        block.append(sum(ja * math.prod(blocks[a + 1:]) for a, ja in enumerate(j)))
        sizes = [len(axis[ja]) for axis, ja in zip(spans, j)]
        offsets = [x - axis[ja].start for x, axis, ja in zip(token, spans, j)]
        position.append(sum(o * math.prod(sizes[a + 1:]) for a, o in enumerate(offsets)))
    return torch.tensor(block), torch.tensor(position)


def rotate(x, cos, sin):
    """Channel pairs (2j, 2j + 1) of token t turned by the angle with cosine cos[t, j] and sine sin[t, j]."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)


def dense(q, k, v, mix, grid, blocks, *, feature_eps=0.0, normalize=True, eps=1e-6, scale=None,
          denominator="paper", rope=None):
    """o_t = sum_s Mc[i(t), i(s)] (R phi(q_t)).(R phi(k_s)) v_s / den_t in fp64, phi = relu + feature_eps.
    paper: den_t = sum_s Mc[i(t), i(s)] phi(q_t).phi(k_s) + eps; official: the query in that sum is the one at
    t's position in the block of s, phi(q_{tau(i(s), p(t))})."""
    q, k, v, mix = (t.double() for t in (q, k, v, mix))
    qf, kf = torch.relu(q) + feature_eps, torch.relu(k) + feature_eps
    qn, kn = (qf, kf) if rope is None else (rotate(qf, *map(torch.Tensor.double, rope)),
                                            rotate(kf, *map(torch.Tensor.double, rope)))
    ids, pos = blocks_and_positions(grid, blocks)
    w = mix[..., ids[:, None], ids[None, :]]                                      # (N, N) or (H, N, N)
    w = w[None, None] if w.dim() == 2 else w[None]                                # broadcast over b (and h)
    num = torch.einsum("bhts,bshe->bthe", torch.einsum("bthd,bshd->bhts", qn, kn) * w, v)
    if not normalize:
        return num * (1.0 if scale is None else scale)
    if denominator == "paper":
        den = (torch.einsum("bthd,bshd->bhts", qf, kf) * w).sum(-1)              # (B, H, N)
    else:
        at = {(int(b), int(p)): t for t, (b, p) in enumerate(zip(ids, pos))}
        tau = torch.tensor([[at[(int(ids[s]), int(pos[t]))] for s in range(len(ids))] for t in range(len(ids))])
        qtau = qf[:, tau]                                                         # (B, N_t, N_s, H, D)
        den = (torch.einsum("btshd,bshd->bhts", qtau, kf) * w).sum(-1)
    return num / (den + eps).transpose(1, 2)[..., None]


def rope_tables(N, D, seed=3):
    g = torch.Generator().manual_seed(seed)
    angles = torch.rand(N, D // 2, generator=g, dtype=torch.float64) * 2 * math.pi
    return angles.cos(), angles.sin()


def inputs(B, grid, H, D, dtype=torch.float64, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    N = math.prod(grid)
    q, k, v = (torch.randn(B, N, H, D, generator=g, dtype=torch.float64).to(dtype).requires_grad_(requires_grad)
               for _ in range(3))
    return q, k, v


def random_mix(M, heads=None, seed=1):
    g = torch.Generator().manual_seed(seed)
    shape = (M, M) if heads is None else (heads, M, M)
    return torch.rand(*shape, generator=g, dtype=torch.float64)


# --- the conventions against their dense formulas: CPU paths in fp64 ----------------------------------------

CASES = [  # (grid, blocks, per-head mix)
    ((6, 8), (2, 2), False),
    ((2, 4, 6), (2, 2, 3), True),
    ((24,), (3,), False),
]


@pytest.mark.parametrize("grid,blocks,per_head", CASES)
@pytest.mark.parametrize("denominator,feature_eps,rope", [("paper", 1e-6, False), ("official", 0.0, False),
                                                          ("official", 1e-6, True), ("paper", 0.25, True)])
@pytest.mark.parametrize("backend", ["blocked", "reference"])
def test_conventions_match_their_dense_formula_in_fp64(grid, blocks, per_head, denominator, feature_eps, rope,
                                                       backend):
    H, D = 2, 8
    q, k, v = inputs(2, grid, H, D)
    mix = random_mix(math.prod(blocks), H if per_head else None)
    tables = rope_tables(q.shape[1], D) if rope else None
    o = mhla_attend(q, k, v, mix, grid, blocks, feature_eps=feature_eps, denominator=denominator, rope=tables,
                    backend=backend)
    want = dense(q, k, v, mix, grid, blocks, feature_eps=feature_eps, denominator=denominator, rope=tables)
    torch.testing.assert_close(o, want, rtol=1e-12, atol=1e-13)


def test_the_two_denominators_differ_and_the_official_one_is_no_rescaling():
    """The official denominator is not the paper's: with these inputs the outputs differ by far more than the
    rounding (a check that the test above can fail); one block is the one case where they agree."""
    grid, blocks = (6, 8), (2, 2)
    q, k, v = inputs(1, grid, 2, 8)
    mix = random_mix(4)
    paper = mhla_attend(q, k, v, mix, grid, blocks, denominator="paper")
    official = mhla_attend(q, k, v, mix, grid, blocks, denominator="official")
    assert (paper - official).abs().max() > 1e-2
    ratio = paper / official
    assert ratio.std() > 1e-3  # not one factor per token either: the whole row changes
    one = torch.ones(1, 1, dtype=torch.float64)
    torch.testing.assert_close(mhla_attend(q, k, v, one, grid, (1, 1), denominator="official"),
                               mhla_attend(q, k, v, one, grid, (1, 1)), rtol=1e-14, atol=1e-15)


# --- through the Triton kernels (interpreter on the CPU; the GPU unchanged), forward and gradients ------------

TRITON_CASES = [  # grid, blocks, per-head mix, denominator, feature_eps, rope, normalize
    ((4, 6), (2, 2), False, "official", 1e-6, False, True),
    ((2, 2, 6), (1, 2, 3), True, "official", 0.0, True, True),
    ((4, 6), (2, 3), False, "paper", 0.1, True, True),
    ((2, 2, 6), (2, 1, 2), False, "paper", 1e-6, True, False),
]


@pytest.mark.parametrize("grid,blocks,per_head,denominator,feature_eps,rope,normalize", TRITON_CASES)
def test_conventions_through_the_triton_kernels(grid, blocks, per_head, denominator, feature_eps, rope, normalize,
                                                one_thread):
    H, D = 2, 16
    q, k, v = inputs(1, grid, H, D, dtype=torch.float32, seed=5, requires_grad=True)
    mix = random_mix(math.prod(blocks), H if per_head else None).float().requires_grad_(True)
    tables = tuple(t.float() for t in rope_tables(q.shape[1], D)) if rope else None
    o = mhla_attend(q, k, v, mix, grid, blocks, feature_eps=feature_eps, denominator=denominator,
                    normalize=normalize, rope=tables, backend="triton")
    g = torch.randn(o.shape, generator=torch.Generator().manual_seed(9))
    grads = torch.autograd.grad(o, (q, k, v, mix), g)

    leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v, mix)]
    want = dense(*leaves[:3], leaves[3], grid, blocks, feature_eps=feature_eps, denominator=denominator,
                 normalize=normalize, rope=tables)
    want_grads = torch.autograd.grad(want, leaves, g.double())
    torch.testing.assert_close(o.double(), want, rtol=1e-4, atol=1e-4)
    for name, got, ref in zip("q k v mix".split(), grads, want_grads):
        scale = ref.abs().max().item()
        assert (got.double() - ref).abs().max().item() <= 1e-4 * max(scale, 1.0), name


# --- the official layers, re-written from the published code -------------------------------------------------


def official_core(q, k, v, conv_weight, grid, blocks, eps, normalize, freqs=None):
    """The published Wan / DiT MHLA layers' attention between the projections and the output norm, in their
    own form: phi = relu + eps on (B, N, H, D); RoPE on the features (Wan); tokens to (B*H, blocks, positions,
    D) by one rearrange; kv = k_rope^T v per block; Mc as a 1x1 convolution over blocks; the normaliser
    block_attn(q @ k_sum) + eps; out = q_rope @ kv / normaliser."""
    q, k = torch.relu(q) + eps, torch.relu(k) + eps
    q_rope, k_rope = (q, k) if freqs is None else (rotate(q, *freqs), rotate(k, *freqs))
    B, N, H, D = q.shape
    sizes = [L // b for L, b in zip(grid, blocks)]

    def pieces(t):  # "b (fb p1 hb p2 wb p3) h c -> (b h) (fb hb wb) (p1 p2 p3) c"
        split = [B] + [d for b, s in zip(blocks, sizes) for d in (b, s)] + [H, D]
        a = len(grid)
        order = [0, 2 * a + 1] + [1 + 2 * i for i in range(a)] + [2 + 2 * i for i in range(a)] + [2 * a + 2]
        return t.reshape(split).permute(order).reshape(B * H, math.prod(blocks), math.prod(sizes), D)

    q, k, v, q_rope, k_rope = map(pieces, (q, k, v, q_rope, k_rope))
    mix = nn.Conv2d(len(conv_weight), len(conv_weight), 1, bias=False).to(conv_weight)
    mix.weight.data = conv_weight
    kv = mix(torch.matmul(k_rope.transpose(-2, -1), v))
    out = torch.matmul(q_rope, kv)
    if normalize:
        out = out / (mix(torch.matmul(q, k.transpose(-2, -1).sum(dim=-1, keepdim=True))) + eps)
    out = out.reshape([B, H] + list(blocks) + sizes + [D])       # back: "(b h) n w d -> b (fb p1 hb p2 wb p3) h d"
    a = len(grid)
    order = [0] + [d for i in range(a) for d in (2 + i, 2 + a + i)] + [1, 2 + 2 * a]
    return out.permute(order).reshape(B, N, H, D)


@pytest.mark.parametrize("grid,blocks,normalize,rope", [((4, 6), (2, 3), True, False),
                                                         ((2, 4, 6), (2, 2, 3), True, True),
                                                         ((2, 4, 6), (1, 2, 2), False, True)])
def test_our_layer_agrees_with_the_official_code_in_fp64(grid, blocks, normalize, rope):
    """Where the definitions agree, the same numbers: numerator, block layout and order, Mc's orientation, RoPE
    on the features with an un-rotated denominator, the eps in phi and in the denominator."""
    H, D, eps = 2, 8, 1e-6
    q, k, v = inputs(2, grid, H, D, seed=11)
    M = math.prod(blocks)
    conv = random_mix(M, seed=4)[..., None, None]
    freqs = rope_tables(q.shape[1], D) if rope else None
    layer = MHLAttention(blocks, feature_eps=eps, eps=eps, normalize=normalize,
                         denominator="official" if normalize else "paper", mix_init="official").double()
    with torch.no_grad():
        layer.mix.copy_(conv[..., 0, 0])
    o = layer(q, k, v, grid, rope=freqs)
    want = official_core(q, k, v, conv, grid, blocks, eps, normalize, freqs)
    torch.testing.assert_close(o, want, rtol=0, atol=1e-15 * max(1.0, want.abs().max().item()))


def test_official_mix_init_is_the_published_one():
    """Global maximum distance, columns summing to 1 (block centres (i + 0.5, j + 0.5): the same distances)."""
    for blocks in ((4, 4), (3, 5, 10), (2, 3)):
        centres = torch.tensor(list(itertools.product(*(range(b) for b in blocks))), dtype=torch.float64) + 0.5
        dist = torch.cdist(centres, centres)
        mat = 1.0 - dist / dist.max()
        torch.testing.assert_close(official_locality_mix(blocks), (mat / mat.sum(0, keepdim=True)).float())
        assert not torch.allclose(official_locality_mix(blocks), locality_mix(blocks))
    assert torch.equal(official_locality_mix((1,)), torch.ones(1, 1))
    assert torch.equal(MHLAttention((3, 5)).mix, locality_mix((3, 5)))                       # ours by default
    assert torch.equal(MHLAttention((3, 5), mix_init="official").mix, official_locality_mix((3, 5)))


def test_official_denominator_needs_equal_blocks():
    q, k, v = inputs(1, (5, 6), 2, 16)
    mix = random_mix(4)
    with pytest.raises(ValueError, match=r"denominator='official' needs blocks that divide the grid.*grid=\(5, 6\)"
                                         r".*blocks=\(2, 2\)"):
        mhla_attend(q, k, v, mix, (5, 6), (2, 2), denominator="official")
    mhla_attend(q, k, v, mix, (5, 6), (2, 2))  # ours cuts ragged blocks


@pytest.mark.parametrize("kwargs,words", [
    (dict(denominator="own"), "denominator='own' is not allowed"),
    (dict(feature_eps=-1.0), "feature_eps=-1.0 is not allowed"),
    (dict(feature_eps=float("nan")), "feature_eps=nan is not allowed"),
    (dict(mix_init="global"), "mix_init='global' is not allowed"),
    (dict(out_norm="heads"), "out_norm='heads' is not allowed"),
    (dict(in_norm=1), "in_norm=1 is not allowed"),
    (dict(normalize=False, denominator="official"), "denominator='official' applies only with normalize=True"),
])
def test_bad_option_values_name_the_option(kwargs, words):
    with pytest.raises(ValueError, match=words) as err:
        AttentionSpec(layers=["mhla"], blocks=[2, 2], **kwargs)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=words.split("=")[0]):
        mediagen.convert(tiny_wan(num_layers=1), "mhla", blocks=[1, 2, 2], rope="features", **kwargs)


# --- the per-head output norm and gate, in a converted layer -------------------------------------------------


def test_per_head_out_norm_and_gate_in_a_wan_layer():
    """out_norm='per_head': o_h / rms(o_h) * w for each head h (one w of head-dim size), then o * SiLU(W_g x + b):
    the official Wan layer's g_norm and gate. out_norm=True normalises over all heads together instead."""
    model = mediagen.convert(tiny_wan(num_layers=1), "mhla", blocks=[1, 2, 2], rope="features", out_norm="per_head",
                             out_gate=True)
    proc = model.blocks[0].attn1.processor
    assert proc.out_norm.weight.shape == (16,)
    torch.manual_seed(2)
    with torch.no_grad():
        proc.out_norm.weight.uniform_(0.5, 1.5)
        proc.core.mix.uniform_(0, 1)
    attn = model.blocks[0].attn1
    x = torch.randn(2, 3 * 4 * 6, 32)
    rotary = model.rope(torch.zeros(1, 1, 3, 8, 12))
    proc.grids.record((3, 4, 6))  # as the transformer's pre-hook does
    with torch.no_grad():
        out = proc(attn, x, rotary_emb=rotary)

    q, k, v = (t.unflatten(2, (2, 16)) for t in (attn.norm_q(attn.to_q(x)), attn.norm_k(attn.to_k(x)), attn.to_v(x)))
    cos, sin = rotary[0][0, :, 0, 0::2], rotary[1][0, :, 0, 1::2]
    o = dense(q, k, v, proc.core.mix, (3, 4, 6), (1, 2, 2), rope=(cos, sin)).float()
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-6) * proc.out_norm.weight
    o = o.flatten(2) * F.silu(proc.out_gate(x))
    with torch.no_grad():
        want = attn.to_out[0](o)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)

    heads_together = mediagen.convert(tiny_wan(num_layers=1), "mhla", blocks=[1, 2, 2], rope="features",
                                      out_norm=True)
    assert heads_together.blocks[0].attn1.processor.out_norm.weight.shape == (32,)


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
    with pytest.raises(ValueError, match=r"denominator='official' needs blocks.*grid=\(3, 4, 6\).*blocks=\(2, 2, 2\)"):
        mediagen.convert(tiny_wan(num_layers=1), "mhla", blocks=[2, 2, 2], grid=(3, 4, 6), rope="features",
                         denominator="official")
    mediagen.convert(tiny_wan(num_layers=1), "mhla", blocks=[3, 2, 2], grid=(3, 4, 6), rope="features",
                     denominator="official")


def test_what_the_official_denominator_cannot_do_is_refused():
    """The CPE cannot go inside the op (the division comes after it), and the sequence-parallel op has neither the
    official denominator nor the feature eps: both say so instead of computing something else."""
    q, k, v = inputs(1, (4, 4), 2, 16, dtype=torch.float32)
    layer = MHLAttention((2, 2), denominator="official")
    with pytest.raises(ValueError, match="cpe= cannot be added inside the op with denominator='official'"):
        layer(q, k, v, (4, 4), cpe=(torch.zeros(32, 1, 3, 3), torch.zeros(32)))
    model = mediagen.convert(tiny_wan(num_layers=1), "mhla", blocks=[1, 2, 2], rope="features", feature_eps=1e-6)
    proc = model.blocks[0].attn1.processor
    proc.sequence_parallel = object()  # any state: the check comes first
    with pytest.raises(ValueError, match=r"feature_eps=1e-06 / denominator='paper' are not supported sequence-par"):
        proc(model.blocks[0].attn1, torch.randn(1, 12, 32))


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


@pytest.mark.parametrize("backend", ["blocked", "triton"])
def test_per_head_out_norm_and_gate_in_a_wan_layer(backend, monkeypatch, one_thread):
    """out_norm='per_head': o_h / rms(o_h) * w for each head h (one w of head-dim size), then o * SiLU(W_g x + b):
    the official Wan layer's g_norm and gate, here with its feature eps and no denominator; forward and
    gradients, on the CPU path and through the Triton kernels. out_norm=True normalises all heads together."""
    monkeypatch.setenv("MEDIAGEN_MHLA_BACKEND", backend)
    model = mediagen.convert(tiny_wan(num_layers=1), "mhla", blocks=[1, 2, 2], rope="features", out_norm="per_head",
                             out_gate=True, normalize=False, feature_eps=1e-6)
    proc = model.blocks[0].attn1.processor
    assert proc.out_norm.weight.shape == (16,)
    torch.manual_seed(2)
    with torch.no_grad():
        proc.out_norm.weight.uniform_(0.5, 1.5)
        proc.core.mix.uniform_(0, 1)
    attn = model.blocks[0].attn1
    x = torch.randn(2, 3 * 4 * 6, 32, requires_grad=True)
    rotary = model.rope(torch.zeros(1, 1, 3, 8, 12))
    proc.grids.record((3, 4, 6))  # as the transformer's pre-hook does
    leaves = (x, proc.out_norm.weight, proc.core.mix, proc.out_gate.weight)
    g = torch.randn(2, 72, 32, generator=torch.Generator().manual_seed(4))
    out = proc(attn, x, rotary_emb=rotary)
    grads = torch.autograd.grad(out, leaves, g)

    q, k, v = (t.unflatten(2, (2, 16)) for t in (attn.norm_q(attn.to_q(x)), attn.norm_k(attn.to_k(x)), attn.to_v(x)))
    cos, sin = rotary[0][0, :, 0, 0::2], rotary[1][0, :, 0, 1::2]
    o = dense(q, k, v, proc.core.mix, (3, 4, 6), (1, 2, 2), rope=(cos, sin), normalize=False, feature_eps=1e-6)
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-6) * proc.out_norm.weight.double()
    o = o.flatten(2) * F.silu(proc.out_gate(x)).double()
    want = attn.to_out[0](o.float())
    want_grads = torch.autograd.grad(want, leaves, g)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    for name, got, ref in zip(("x", "out_norm", "mix", "gate"), grads, want_grads):
        torch.testing.assert_close(got, ref, rtol=1e-3, atol=1e-4 * ref.abs().max().item(),
                                   msg=lambda m, name=name: f"{name}: {m}")

    heads_together = mediagen.convert(tiny_wan(num_layers=1), "mhla", blocks=[1, 2, 2], rope="features",
                                      out_norm=True)
    assert heads_together.blocks[0].attn1.processor.out_norm.weight.shape == (32,)


# --- a small official Wan, re-written from the published structure (original Wan names) ------------------


class WanRMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope_params(max_len, dim, theta=10000):
    freqs = torch.outer(torch.arange(max_len), 1.0 / torch.pow(theta, torch.arange(0, dim, 2).double().div(dim)))
    return torch.polar(torch.ones_like(freqs), freqs)


def rope_apply(x, grid, freqs):
    """The published rope_apply: channel pairs as complex numbers times the (frame, row, column) angles, fp64."""
    n, c = x.size(2), x.size(3) // 2
    f, h, w = grid
    parts = freqs.split([c - 2 * (c // 3), c // 3, c // 3], dim=1)
    table = torch.cat([parts[0][:f].view(f, 1, 1, -1).expand(f, h, w, -1),
                       parts[1][:h].view(1, h, 1, -1).expand(f, h, w, -1),
                       parts[2][:w].view(1, 1, w, -1).expand(f, h, w, -1)], dim=-1).reshape(f * h * w, 1, -1)
    xc = torch.view_as_complex(x.double().reshape(x.shape[0], f * h * w, n, -1, 2))
    return torch.view_as_real(xc * table).flatten(3).float()


class OfficialSoftmaxAttention(nn.Module):  # WanSelfAttention (and the cross-attention's projections)
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.norm_q, self.norm_k = WanRMSNorm(dim), WanRMSNorm(dim)

    def forward(self, x, grid, freqs, context=None):
        b, d = x.shape[0], x.shape[2] // self.heads
        src = x if context is None else context
        q = self.norm_q(self.q(x)).view(b, -1, self.heads, d)
        k = self.norm_k(self.k(src)).view(b, -1, self.heads, d)
        v = self.v(src).view(b, -1, self.heads, d)
        if context is None:
            q, k = rope_apply(q, grid, freqs), rope_apply(k, grid, freqs)
        o = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v))).transpose(1, 2)
        return self.o(o.flatten(2))


class BlockDistanceConv(nn.Module):  # the official Mc holder: a 1x1 convolution over blocks
    def __init__(self, M):
        super().__init__()
        self.conv = nn.Conv2d(M, M, 1, bias=False)


class OfficialWanMHLA(nn.Module):  # MHLA_Video_Uni
    def __init__(self, dim, heads, block_layout, gated, lepe, normalize_out, eps=1e-6):
        super().__init__()
        self.heads, self.head_dim, self.blocks, self.eps, self.normalize_out = heads, dim // heads, block_layout, \
            eps, normalize_out
        self.q, self.k, self.v = (nn.Linear(dim, dim) for _ in range(3))
        self.g = nn.Linear(dim, dim) if gated else None
        self.g_norm = WanRMSNorm(dim // heads, eps=eps)
        self.norm_q, self.norm_k = WanRMSNorm(dim, eps=eps), WanRMSNorm(dim, eps=eps)
        self.block_attn = BlockDistanceConv(math.prod(block_layout))
        self.lepe = nn.Conv3d(dim, dim, 3, 1, 1, groups=dim) if lepe else None
        self.o = nn.Linear(dim, dim)

    def forward(self, x, grid, freqs):
        B, N, C = x.shape
        q, k, v = self.q(x), self.k(x), self.v(x)
        lepe = None if self.lepe is None else \
            self.lepe(v.transpose(1, 2).reshape(B, C, *grid)).flatten(2).transpose(1, 2)
        q, k, v = self.norm_q(q.float()), self.norm_k(k.float()), v.float()
        q, k = torch.relu(q) + self.eps, torch.relu(k) + self.eps
        q, k, v = (t.unflatten(2, (self.heads, -1)) for t in (q, k, v))
        q_rope, k_rope = rope_apply(q, grid, freqs), rope_apply(k, grid, freqs)
        out = official_core_on_features(q, k, v, q_rope, k_rope, self.block_attn.conv, grid, self.blocks, self.eps,
                                        self.normalize_out)
        out = self.g_norm(out).flatten(2)
        if self.g is not None:
            out = out * F.silu(self.g(x))
        if lepe is not None:
            out = out + lepe
        return self.o(out)


def official_core_on_features(q, k, v, q_rope, k_rope, conv, grid, blocks, eps, normalize):
    """The published block-major part, from features on: (B, N, H, D) in, (B, N, H, D) out."""
    B, N, H, D = q.shape
    sizes = [L // b for L, b in zip(grid, blocks)]
    a = len(grid)

    def pieces(t):
        split = [B] + [d for b, s in zip(blocks, sizes) for d in (b, s)] + [H, D]
        order = [0, 2 * a + 1] + [1 + 2 * i for i in range(a)] + [2 + 2 * i for i in range(a)] + [2 * a + 2]
        return t.reshape(split).permute(order).reshape(B * H, math.prod(blocks), math.prod(sizes), D)

    q, k, v, q_rope, k_rope = map(pieces, (q, k, v, q_rope, k_rope))
    out = torch.matmul(q_rope, conv(torch.matmul(k_rope.transpose(-2, -1), v)))
    if normalize:
        out = out / (conv(torch.matmul(q, k.transpose(-2, -1).sum(-1, keepdim=True))) + eps)
    out = out.reshape([B, H] + list(blocks) + sizes + [D])
    order = [0] + [d for i in range(a) for d in (2 + i, 2 + a + i)] + [1, 2 + 2 * a]
    return out.permute(order).reshape(B, N, H, D)


class OfficialWanBlock(nn.Module):  # WanAttentionBlock (t2v, cross_attn_norm=True)
    def __init__(self, dim, ffn_dim, heads, mhla, **mhla_kwargs):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6, elementwise_affine=False)
        self.self_attn = OfficialWanMHLA(dim, heads, **mhla_kwargs) if mhla else OfficialSoftmaxAttention(dim, heads)
        self.norm3 = nn.LayerNorm(dim, eps=1e-6)
        self.cross_attn = OfficialSoftmaxAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6, elementwise_affine=False)
        self.ffn = nn.Sequential(nn.Linear(dim, ffn_dim), nn.GELU(approximate="tanh"), nn.Linear(ffn_dim, dim))
        self.modulation = nn.Parameter(torch.randn(1, 6, dim) / dim ** 0.5)

    def forward(self, x, e, grid, freqs, context):
        e = (self.modulation + e).chunk(6, dim=1)
        x = x + self.self_attn(self.norm1(x) * (1 + e[1]) + e[0], grid, freqs) * e[2]
        x = x + self.cross_attn(self.norm3(x), grid, freqs, context=context)
        return x + self.ffn(self.norm2(x) * (1 + e[4]) + e[3]) * e[5]


class OfficialWanHead(nn.Module):
    def __init__(self, dim, out_dim, patch):
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=1e-6, elementwise_affine=False)
        self.head = nn.Linear(dim, math.prod(patch) * out_dim)
        self.modulation = nn.Parameter(torch.randn(1, 2, dim) / dim ** 0.5)

    def forward(self, x, e):
        e = (self.modulation + e.unsqueeze(1)).chunk(2, dim=1)
        return self.head(self.norm(x) * (1 + e[1]) + e[0])


class OfficialWan(nn.Module):  # WanLinearAttentionModel with attn_type="mhla_uni"
    def __init__(self, mhla_layers, dim=32, heads=2, ffn_dim=64, layers=3, in_dim=1, text_dim=32, freq_dim=256,
                 patch=(1, 2, 2), **mhla_kwargs):
        super().__init__()
        self.dim, self.freq_dim, self.patch, self.out_dim = dim, freq_dim, patch, in_dim
        self.patch_embedding = nn.Conv3d(in_dim, dim, kernel_size=patch, stride=patch)
        self.text_embedding = nn.Sequential(nn.Linear(text_dim, dim), nn.GELU(approximate="tanh"), nn.Linear(dim, dim))
        self.time_embedding = nn.Sequential(nn.Linear(freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(dim, dim * 6))
        self.blocks = nn.ModuleList(OfficialWanBlock(dim, ffn_dim, heads, i in mhla_layers, **mhla_kwargs)
                                    for i in range(layers))
        self.head = OfficialWanHead(dim, in_dim, patch)
        d = dim // heads
        self.freqs = torch.cat([rope_params(1024, d - 4 * (d // 6)), rope_params(1024, 2 * (d // 6)),
                                rope_params(1024, 2 * (d // 6))], dim=1)

    def forward(self, x, t, context):
        x = self.patch_embedding(x)
        grid = tuple(x.shape[2:])
        x = x.flatten(2).transpose(1, 2)
        half = self.freq_dim // 2
        sinusoid = torch.outer(t.double(), torch.pow(10000, -torch.arange(half).double().div(half)))
        e = self.time_embedding(torch.cat([sinusoid.cos(), sinusoid.sin()], dim=1).float())
        e0 = self.time_projection(e).unflatten(1, (6, self.dim))
        context = self.text_embedding(context)
        for block in self.blocks:
            x = block(x, e0, grid, self.freqs, context)
        x = self.head(x, e)
        c, (f, h, w) = self.out_dim, grid
        x = x.view(x.shape[0], f, h, w, *self.patch, c)
        x = torch.einsum("bfhwpqrc->bcfphqwr", x)
        return x.reshape(x.shape[0], c, *(g * p for g, p in zip(grid, self.patch)))


def randomise_(module, seed):
    """Random values in every parameter (norm weights near 1, Mc in [0, 1 / M]) so no weight is its init."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("conv.weight") and p.dim() == 4 and p.shape[2:] == (1, 1):
                p.copy_(torch.rand(p.shape, generator=g) / p.shape[0])
            elif "norm" in name and name.endswith("weight"):
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() > 1 else 0.1))
    return module


def close(got, want):
    """Equal up to fp32 rounding through a few layers: 1e-5 of the output's scale."""
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


def wan_input(seed=7, grid=(4, 6, 6), batch=2):
    g = torch.Generator().manual_seed(seed)
    f, h, w = grid
    return (torch.randn(batch, 1, f, 2 * h, 2 * w, generator=g), torch.tensor([3.0, 7.5])[:batch],
            torch.randn(batch, 5, 32, generator=g))


@pytest.mark.parametrize("kind", ["recipe", "hybrid-lepe", "normalised"])
def test_an_official_wan_checkpoint_loads_with_identical_outputs(kind, tmp_path, one_thread):
    """The published Wan recipe (every layer MHLA, gated, norm_output false), a hybrid with a LePE and softmax in
    layers 0 and 3, and a model trained with the denominator (norm_output true: the official one)."""
    layers, blocks = 4, (2, 3, 2)
    mhla = {"recipe": set(range(layers)), "hybrid-lepe": {1, 2}, "normalised": {0, 1, 2, 3}}[kind]
    normalize = kind == "normalised"
    official = randomise_(OfficialWan(mhla, layers=layers, block_layout=blocks, gated=kind != "hybrid-lepe",
                                      lepe=kind == "hybrid-lepe", normalize_out=normalize), seed=1).eval()
    sd = official.state_dict()
    assert "blocks.1.self_attn.block_attn.conv.weight" in sd and "blocks.0.cross_attn.norm_k.weight" in sd

    model = load_official_state_dict(tiny_wan(num_layers=layers), sd, blocks=blocks, norm_output=normalize)
    spec = model.config.mediagen_attention
    assert spec["layers"] == ["mhla" if i in mhla else "sdpa" for i in range(layers)]
    assert spec["out_norm"] == "per_head" and spec["denominator"] == ("official" if normalize else "paper")
    x, t, text = wan_input()
    with torch.no_grad():
        want = official(x, t, text)
        got = model(x, t, text, return_dict=False)[0]
    assert want.abs().max() > 0.1
    close(got, want)

    model.save_pretrained(tmp_path)  # a converted model like any other: it loads back with the same outputs
    with torch.no_grad():
        assert torch.equal(load_transformer(tmp_path).eval()(x, t, text, return_dict=False)[0], got)


def test_a_wan_checkpoint_from_a_safetensors_file_and_what_it_refuses(tmp_path):
    from safetensors.torch import save_file

    official = randomise_(OfficialWan({0, 1}, layers=2, block_layout=(1, 3, 2), gated=True, lepe=False,
                                      normalize_out=False), seed=2).eval()
    sd = official.state_dict()
    path = tmp_path / "wan-mhla.safetensors"
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    model = load_official_state_dict(tiny_wan(num_layers=2), str(path), blocks=(1, 3, 2))
    x, t, text = wan_input(grid=(2, 6, 4))
    with torch.no_grad():
        close(model(x, t, text, return_dict=False)[0], official(x, t, text))

    def refused(state_dict, match, **kw):
        with pytest.raises(ValueError, match=match) as err:
            load_official_state_dict(tiny_wan(num_layers=2), state_dict, **kw)
        assert "\n" not in str(err.value)

    refused(str(tmp_path / "wan.pth"), r"state_dict=.*wan\.pth.*not allowed.*safetensors")
    refused({"state_dict": sd}, r"nested 'state_dict'.*checkpoint\['state_dict'\]")
    refused(sd, r"blocks=\(3, 5, 10\) makes 150 blocks but the checkpoint's Mc is 6 x 6")   # the official default
    refused(sd, r"blocks=\(2, 2\) is not allowed", blocks=(2, 2))
    refused(dict(sd, **{"blocks.0.self_attn.extra.weight": torch.ones(2)}),
            r"1 checkpoint parameter\(s\) have no place.*blocks\.0\.self_attn\.extra\.weight", blocks=(1, 3, 2))
    refused({k: v for k, v in sd.items() if k != "blocks.1.ffn.2.bias"},
            r"1 model parameter\(s\) get no value \(blocks\.1\.ffn\.net\.2\.bias\)", blocks=(1, 3, 2))
    refused({k: v for k, v in sd.items() if k != "blocks.1.self_attn.g.weight"}, r"differ in gating",
            blocks=(1, 3, 2))
    refused(sd, r"norm_output='no' is not allowed", blocks=(1, 3, 2), norm_output="no")
    refused(sd, r"eps=0 is not allowed", blocks=(1, 3, 2), eps=0)


# --- a small official DiT, re-written from the published structure (facebookresearch DiT names) -----------


class OfficialDiTMHLA(nn.Module):  # MHLA4DiT
    def __init__(self, dim, heads, blocks_per_side, eps=1e-6):
        super().__init__()
        self.heads, self.side, self.eps = heads, blocks_per_side, eps
        self.norm = nn.LayerNorm(dim)
        self.to_qkv = nn.Linear(dim, 3 * dim, bias=True)
        self.lepe = nn.Conv2d(dim, dim, 3, 1, 1, groups=dim)
        self.piece_attn = BlockDistanceConv(blocks_per_side ** 2)
        self.to_out = nn.Sequential(nn.Linear(dim, dim), nn.Dropout(0.1))

    def forward(self, x):
        """x: (B, pieces, block_size, C), tokens block-major as the published layer takes them."""
        x = self.norm(x)
        B, P, W, C = x.shape
        s, r = self.side, math.isqrt(W)  # blocks per side, tokens per block side
        q, k, v = self.to_qkv(x).chunk(3, dim=-1)
        image = v.reshape(B, s, s, r, r, C).permute(0, 5, 1, 3, 2, 4).reshape(B, C, s * r, s * r)
        lepe = self.lepe(image).reshape(B, C, s, r, s, r).permute(0, 2, 4, 3, 5, 1).reshape(B, P, W, C)
        q, k = torch.relu(q) + self.eps, torch.relu(k) + self.eps
        q, k, v = (t.reshape(B, P, W, self.heads, -1).permute(0, 3, 1, 2, 4).reshape(B * self.heads, P, W, -1)
                   for t in (q, k, v))
        k = k.transpose(-2, -1)
        conv = self.piece_attn.conv
        out = torch.matmul(q, conv(torch.matmul(k, v))) / (conv(torch.matmul(q, k.sum(-1, keepdim=True))) + self.eps)
        out = out.reshape(B, self.heads, P, W, -1).permute(0, 2, 3, 1, 4).reshape(B, P, W, C)
        return self.to_out(out + lepe)


class Mlp(nn.Module):  # timm's Mlp as DiT builds it
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), nn.GELU(approximate="tanh"), nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class OfficialDiTBlock(nn.Module):  # DiTBlock_MHLA
    def __init__(self, dim, heads, blocks_per_side):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.attn = OfficialDiTMHLA(dim, heads, blocks_per_side)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.mlp = Mlp(dim, 4 * dim)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))

    def forward(self, x, c):
        shift, scale, gate, shift2, scale2, gate2 = self.adaLN_modulation(c).chunk(6, dim=1)
        B, N, C = x.shape
        P = self.attn.side ** 2
        h = (self.norm1(x) * (1 + scale[:, None]) + shift[:, None]).reshape(B, P, N // P, C)
        x = x + gate[:, None] * self.attn(h).reshape(B, N, C)
        return x + gate2[:, None] * self.mlp(self.norm2(x) * (1 + scale2[:, None]) + shift2[:, None])


def sincos_2d(dim, side):
    """MAE's fixed 2D sin-cos table (get_2d_sincos_pos_embed), (side * side, dim)."""
    def one_axis(d, pos):
        omega = 1.0 / 10000 ** (torch.arange(d // 2, dtype=torch.float64) / (d / 2.0))
        out = torch.outer(pos.reshape(-1), omega)
        return torch.cat([out.sin(), out.cos()], dim=1)

    grid_w, grid_h = torch.meshgrid(torch.arange(side, dtype=torch.float64), torch.arange(side, dtype=torch.float64),
                                    indexing="xy")
    return torch.cat([one_axis(dim // 2, grid_w), one_axis(dim // 2, grid_h)], dim=1)


class PatchEmbed(nn.Module):
    def __init__(self, in_dim, dim, patch):
        super().__init__()
        self.proj = nn.Conv2d(in_dim, dim, patch, patch)


class TimestepEmbedder(nn.Module):
    def __init__(self, dim, freq_dim=256):
        super().__init__()
        self.mlp, self.freq_dim = nn.Sequential(nn.Linear(freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim)), freq_dim

    def forward(self, t):
        half = self.freq_dim // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)
        args = t[:, None].float() * freqs[None]
        return self.mlp(torch.cat([torch.cos(args), torch.sin(args)], dim=-1))


class LabelEmbedder(nn.Module):
    def __init__(self, classes, dim):
        super().__init__()
        self.embedding_table = nn.Embedding(classes + 1, dim)


class FinalLayer(nn.Module):
    def __init__(self, dim, patch, out_dim):
        super().__init__()
        self.norm_final = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(dim, patch * patch * out_dim)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 2 * dim))

    def forward(self, x, c):
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(self.norm_final(x) * (1 + scale[:, None]) + shift[:, None])


class OfficialDiT(nn.Module):  # DiT_MHLA (learn_sigma=False), block_size tokens per block
    def __init__(self, input_size=8, patch=2, in_dim=1, dim=32, heads=2, layers=2, classes=10, block_size=4):
        super().__init__()
        self.patch, self.out_dim, self.side = patch, in_dim, input_size // patch
        self.piece = math.isqrt(block_size)
        self.x_embedder = PatchEmbed(in_dim, dim, patch)
        self.t_embedder = TimestepEmbedder(dim)
        self.y_embedder = LabelEmbedder(classes, dim)
        self.pos_embed = nn.Parameter(sincos_2d(dim, self.side).float()[None], requires_grad=False)
        self.blocks = nn.ModuleList(OfficialDiTBlock(dim, heads, self.side // self.piece) for _ in range(layers))
        self.final_layer = FinalLayer(dim, patch, in_dim)

    def forward(self, x, t, y):
        x = self.x_embedder.proj(x).flatten(2).transpose(1, 2) + self.pos_embed
        B, N, C = x.shape
        s, r = self.side // self.piece, self.piece
        x = x.reshape(B, s, r, s, r, C).permute(0, 1, 3, 2, 4, 5).reshape(B, N, C)       # rearrange_patches
        c = self.t_embedder(t) + self.y_embedder.embedding_table(y)
        for block in self.blocks:
            x = block(x, c)
        x = self.final_layer(x, c)
        x = x.reshape(B, s, s, r, r, -1).permute(0, 1, 3, 2, 4, 5).reshape(B, self.side, self.side, -1)
        p = self.patch
        x = x.reshape(B, self.side, self.side, p, p, self.out_dim)
        return torch.einsum("nhwpqc->nchpwq", x).reshape(B, self.out_dim, self.side * p, self.side * p)


def randomise_dit_(official, seed):
    randomise_(official, seed)
    with torch.no_grad():
        official.pos_embed.copy_(sincos_2d(official.pos_embed.shape[-1], official.side).float()[None])
    return official


@pytest.mark.parametrize("block_size", [4, 16])
def test_an_official_dit_checkpoint_loads_with_identical_outputs(block_size, tmp_path):
    official = randomise_dit_(OfficialDiT(block_size=block_size), seed=3).eval()
    sd = official.state_dict()
    assert {"blocks.0.attn.to_qkv.weight", "blocks.1.attn.piece_attn.conv.weight", "pos_embed"} <= set(sd)
    model = load_official_state_dict(tiny_dit(num_layers=2, norm_eps=1e-6), sd)
    spec = model.config.mediagen_attention
    side = 4 // math.isqrt(block_size)
    assert spec["blocks"] == [side, side] and spec["denominator"] == "official" and spec["in_norm"]
    g = torch.Generator().manual_seed(5)
    x, t, y = torch.randn(2, 1, 8, 8, generator=g), torch.tensor([10.0, 700.0]), torch.tensor([3, 10])
    with torch.no_grad():
        want = official(x, t, y)
        got = model(x, t, y, return_dict=False)[0]
    assert want.abs().max() > 0.1
    close(got, want)

    # diffusers' config does not keep the official timestep sinusoid: a saved copy needs it set again
    model.save_pretrained(tmp_path)
    back = load_transformer(tmp_path).eval()
    with torch.no_grad():
        assert not torch.allclose(back(x, t, y, return_dict=False)[0], want, atol=1e-3)
        use_official_timesteps(back)
        assert torch.equal(back(x, t, y, return_dict=False)[0], got)


def test_a_dit_checkpoint_that_does_not_fit_is_refused():
    sd = randomise_dit_(OfficialDiT(), seed=4).state_dict()

    def refused(model, state_dict, match, **kw):
        with pytest.raises(ValueError, match=match) as err:
            load_official_state_dict(model, state_dict, **kw)
        assert "\n" not in str(err.value)

    refused(tiny_dit(num_layers=2), sd, r"norm_eps=1e-05.*1e-6")
    refused(tiny_dit(num_layers=3, norm_eps=1e-6), sd, r"every block.*2 blocks and the model has 3")
    refused(tiny_dit(num_layers=2, norm_eps=1e-6), sd, r"blocks=\(2, 1\) makes 2 blocks.*4 x 4", blocks=(2, 1))
    refused(tiny_dit(num_layers=2, norm_eps=1e-6), sd, r"norm_output=False is not allowed for a DiT",
            norm_output=False)
    refused(tiny_dit(num_layers=2, norm_eps=1e-6), dict(sd, **{"blocks.0.attn.q_norm.weight": torch.ones(32)}),
            r"qk_norm=True")
    refused(tiny_dit(num_layers=2, norm_eps=1e-6), dict(sd, pos_embed=sd["pos_embed"] + 0.1), r"pos_embed")
    refused(tiny_wan(num_layers=2), sd, r"no MHLA layer .*not an official Wan MHLA checkpoint")
    with pytest.raises(ValueError, match=r"use_official_timesteps is for DiT models"):
        use_official_timesteps(tiny_wan(num_layers=1))


def test_official_options_name_every_convention():
    wan = official_options("wan", gated=True)
    assert wan == dict(feature_map="relu", feature_eps=1e-6, eps=1e-6, mix_init="official", per_head_mix=False,
                       rope="features", normalize=False, denominator="paper", scale=None, out_norm="per_head",
                       out_gate=True, cpe_kernel=0, in_norm=False)
    assert official_options("wan", norm_output=True)["denominator"] == "official"
    assert official_options("dit")["cpe_kernel"] == 3 and official_options("dit")["in_norm"]
    AttentionSpec(layers=["mhla"], blocks=[2, 2], **official_options("dit"))  # valid values
    with pytest.raises(ValueError, match="family='sana' is not allowed"):
        official_options("sana")

"""The plain-PyTorch MHLA reference against the dense fp64 oracle, gradcheck, and bad inputs."""

import math
import random

import pytest
import torch

from mediagen.kernels import mhla, mhla_reference, token_block_ids
from mediagen.kernels.mhla.layout import block_bounds
from mhla_oracle import block_ids as oracle_block_ids
from mhla_oracle import mhla_dense

CASES = [  # grid, blocks (ragged ones included)
    ((37,), (5,)),
    ((7, 9), (3, 2)),
    ((6, 5), (6, 5)),
    ((3, 5, 7), (2, 2, 3)),
    ((4, 6, 5), (1, 3, 5)),
]


def rand_inputs(B, grid, H, D, dtype=torch.float64, positive=True, gen=None):
    N = math.prod(grid)
    q, k = (torch.rand(B, N, H, D, dtype=dtype, generator=gen) for _ in range(2))
    if not positive:
        q, k = q * 2 - 1, k * 2 - 1
    v = torch.randn(B, N, H, D, dtype=dtype, generator=gen)
    return q, k, v


@pytest.fixture(autouse=True)
def seeded():
    """Inputs are drawn from the global generator, seeded at every test's start so that a failure reproduces."""
    torch.manual_seed(0)


@pytest.mark.parametrize("grid,blocks", CASES)
@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("normalize", [True, False])
def test_reference_matches_dense_oracle(grid, blocks, per_head, normalize):
    B, H, D, M = 2, 3, 8, math.prod(blocks)
    q, k, v = rand_inputs(B, grid, H, D)
    mix = torch.rand((H, M, M) if per_head else (M, M), dtype=torch.float64)
    scale = None if normalize else 0.37
    got = mhla_reference(q, k, v, mix, grid, blocks, normalize=normalize, scale=scale)
    want = mhla_dense(q, k, v, mix, grid, blocks, normalize=normalize, scale=scale)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("feature_map", ["relu", "elu1"])
def test_reference_feature_maps(feature_map):
    grid, blocks = (5, 6), (2, 3)
    q, k, v = rand_inputs(1, grid, 2, 16, positive=False)
    mix = torch.rand(6, 6, dtype=torch.float64)
    got = mhla_reference(q, k, v, mix, grid, blocks, feature_map=feature_map)
    want = mhla_dense(q, k, v, mix, grid, blocks, feature_map=feature_map)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


# The README's rule, written out: along an axis of length L cut into b blocks, block j spans
# [floor(j*L/b), floor((j+1)*L/b)). Sizes computed by hand, so a change of the rule (ceil, round, the
# remainder put first) in the package or in the oracle is caught, not carried along by both.
AXIS_SIZES = [  # L, b, block sizes along the axis
    (7, 3, [2, 2, 3]),
    (10, 4, [2, 3, 2, 3]),
    (9, 4, [2, 2, 2, 3]),
    (13, 5, [2, 3, 2, 3, 3]),
    (5, 2, [2, 3]),
    (11, 3, [3, 4, 4]),
    (6, 6, [1, 1, 1, 1, 1, 1]),
    (4, 1, [4]),
    (37, 5, [7, 7, 8, 7, 8]),
]


def _runs(ids):
    """Lengths of the runs of equal consecutive values, and the values: [0, 0, 1] -> ([2, 1], [0, 1])."""
    sizes, values = [], []
    for x in ids:
        if values and values[-1] == x:
            sizes[-1] += 1
        else:
            sizes.append(1)
            values.append(x)
    return sizes, values


@pytest.mark.parametrize("L,b,sizes", AXIS_SIZES)
def test_block_sizes_along_an_axis_follow_the_floor_rule(L, b, sizes):
    assert sum(sizes) == L and len(sizes) == b
    for name, ids in (("package", token_block_ids((L,), (b,))), ("oracle", oracle_block_ids((L,), (b,)))):
        assert _runs(ids.tolist()) == (sizes, list(range(b))), f"{name}: L={L}, b={b} gives {ids.tolist()}"
    starts = [sum(sizes[:j]) for j in range(b)]
    assert block_bounds(L, b) == [(s, s + n) for s, n in zip(starts, sizes)]


def test_block_ids_of_a_ragged_2d_grid():
    """grid (5, 7), blocks (2, 3): rows in blocks of 2, 3; columns in blocks of 2, 2, 3; ids row-major."""
    want = torch.tensor([
        [0, 0, 1, 1, 2, 2, 2],
        [0, 0, 1, 1, 2, 2, 2],
        [3, 3, 4, 4, 5, 5, 5],
        [3, 3, 4, 4, 5, 5, 5],
        [3, 3, 4, 4, 5, 5, 5],
    ])
    assert torch.equal(token_block_ids((5, 7), (2, 3)).view(5, 7), want)
    assert torch.equal(oracle_block_ids((5, 7), (2, 3)).view(5, 7), want)


def test_block_ids_of_a_ragged_3d_grid():
    """grid (3, 4, 5), blocks (2, 3, 2): frames in blocks of 1, 2; rows 1, 1, 2; columns 2, 3."""
    frame, row, col = [0, 1, 1], [0, 1, 2, 2], [0, 0, 1, 1, 1]
    want = torch.tensor([[[f * 6 + r * 2 + c for c in col] for r in row] for f in frame])
    for ids in (token_block_ids((3, 4, 5), (2, 3, 2)), oracle_block_ids((3, 4, 5), (2, 3, 2))):
        assert torch.equal(ids.view(3, 4, 5), want)
        # tokens per block: the products of the axes' block sizes
        assert torch.bincount(ids).tolist() == [2, 3, 2, 3, 4, 6, 4, 6, 4, 6, 8, 12]


def test_package_block_ids_agree_with_the_rule_on_many_grids():
    rng = random.Random(0)
    for _ in range(60):
        ndim = rng.randint(1, 3)
        grid = tuple(rng.randint(1, 12) for _ in range(ndim))
        blocks = tuple(rng.randint(1, g) for g in grid)
        assert torch.equal(token_block_ids(grid, blocks), oracle_block_ids(grid, blocks)), (grid, blocks)
        for L, b in zip(grid, blocks):  # blocks along an axis differ in size by at most one
            sizes = [e - s for s, e in block_bounds(L, b)]
            assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1, (L, b, sizes)


def test_block_ids_are_row_major_over_block_grid():
    grid, blocks = (4, 6), (2, 3)
    ids = token_block_ids(grid, blocks).view(grid)
    assert ids[0, 0] == 0 and ids[0, 5] == 2 and ids[3, 0] == 3 and ids[3, 5] == 5


def test_reference_gradcheck():
    grid, blocks = (3, 4), (2, 2)
    q, k, v = (t.requires_grad_() for t in rand_inputs(1, grid, 2, 4))
    mix = torch.rand(2, 4, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda q, k, v, m: mhla_reference(q, k, v, m, grid, blocks, feature_map="elu1"), (q, k, v, mix))


def _ok():
    q = torch.rand(1, 12, 2, 16)
    return dict(q=q, k=q.clone(), v=q.clone(), mix=torch.rand(4, 4), grid=(3, 4), blocks=(2, 2))


BAD = [
    (dict(grid=(3, 5)), "prod(grid)"),
    (dict(blocks=(2,)), "one count per grid axis"),
    (dict(blocks=(0, 2)), "blocks[0]"),
    (dict(blocks=(4, 2)), "blocks[0]=4"),
    (dict(mix=torch.rand(3, 3)), "mix has shape"),
    (dict(mix=torch.rand(5, 4, 4)), "mix has shape"),
    (dict(k=torch.rand(1, 12, 2, 16, dtype=torch.float16)), "share one dtype"),
    (dict(v=torch.rand(1, 12, 2, 8)), "one shape"),
    (dict(q=torch.rand(1, 12, 2, 8), k=torch.rand(1, 12, 2, 8), v=torch.rand(1, 12, 2, 8)), "head dim D=8"),
    (dict(q=torch.rand(1, 12, 2, 264), k=torch.rand(1, 12, 2, 264), v=torch.rand(1, 12, 2, 264)), "D=264"),
    (dict(q=torch.rand(12, 2, 16)), "4-D tensor"),
    (dict(grid=(1, 2, 3, 2), blocks=(1, 1, 1, 1)), "1 to 3 axes"),
    (dict(q=torch.rand(1, 12, 2, 16, dtype=torch.float64), k=torch.rand(1, 12, 2, 16, dtype=torch.float64),
          v=torch.rand(1, 12, 2, 16, dtype=torch.float64)), "allowed"),
]


@pytest.mark.parametrize("change,message", BAD)
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_bad_input_raises_value_error(change, message, backend):
    args = _ok()
    args.update(change)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        mhla(args["q"], args["k"], args["v"], args["mix"], args["grid"], args["blocks"], backend=backend)


def test_bad_options_raise():
    a = _ok()
    with pytest.raises(ValueError, match="feature_map='gelu'"):
        mhla(a["q"], a["k"], a["v"], a["mix"], a["grid"], a["blocks"], feature_map="gelu")
    with pytest.raises(ValueError, match="scale"):
        mhla(a["q"], a["k"], a["v"], a["mix"], a["grid"], a["blocks"], scale=2.0)
    with pytest.raises(ValueError, match="backend='cuda'"):
        mhla(a["q"], a["k"], a["v"], a["mix"], a["grid"], a["blocks"], backend="cuda")


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_checks_still_apply_after_a_call_passed_them(backend):
    """Arguments that passed the checks once are not checked again, but only when everything the checks read is
    the same: values that compare equal to allowed ones without being allowed (floats and bools for ints, 1 for
    True) still raise after a call with the allowed ones."""
    a = _ok()
    q, k, v = a["q"], a["k"], a["v"]
    mix2 = torch.rand(2, 2)
    for good, bad, message in [
        (((3, 4), (2, 2), a["mix"], True), ((3.0, 4), (2, 2), a["mix"], True), "positive ints"),
        (((3, 4), (1, 2), mix2, True), ((3, 4), (True, 2), mix2, True), r"blocks\[0\]=True"),
        (((3, 4), (2, 2), a["mix"], True), ((3, 4), (2, 2), a["mix"], 1), "True or False"),
    ]:
        grid, blocks, mix, normalize = good
        mhla(q, k, v, mix, grid, blocks, normalize=normalize, backend=backend)
        grid, blocks, mix, normalize = bad
        with pytest.raises(ValueError, match=message):
            mhla(q, k, v, mix, grid, blocks, normalize=normalize, backend=backend)


def test_a_compiled_caller_is_compiled_once(monkeypatch):
    """The checks' cache of passed arguments stays out of traced code: a first call made compiled (the cache
    empty) and the next one share one graph, where a traced lookup would guard on the cache and recompile."""
    from torch._dynamo.utils import counters

    from mediagen.kernels.mhla import checks

    monkeypatch.setattr(checks, "_passed", {})
    a = _ok()

    def layer(q, k, v, mix):
        grid, blocks = checks.check_mhla_args(q, k, v, mix, a["grid"], a["blocks"], True, 1e-6, None, None)
        return q * len(grid) + k * len(blocks)

    torch._dynamo.reset()
    compiled = torch.compile(layer, backend="eager")
    before = counters["stats"]["unique_graphs"]
    for _ in range(3):
        compiled(a["q"], a["k"], a["v"], a["mix"])
    assert counters["stats"]["unique_graphs"] - before == 1
    with pytest.raises(ValueError, match="blocks"):  # the traced checks still check
        torch.compile(lambda q: checks.check_mhla_args(q, q, q, a["mix"], a["grid"], (9, 9), True, 1e-6, None,
                                                       None), backend="eager")(a["q"])
    torch._dynamo.reset()


def _complex_rotate(x, angle):
    """Channel pairs (2j, 2j+1) of x (B, N, H, D) as complex numbers times exp(i * angle[t, j])."""
    z = torch.view_as_complex(x.unflatten(-1, (-1, 2)).contiguous())
    return torch.view_as_real(z * torch.polar(torch.ones_like(angle), angle)[None, :, None, :]).flatten(-2)


@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("normalize", [True, False])
def test_reference_rope_rotates_the_numerator_only(per_head, normalize):
    """rope=(cos, sin): numerator on rotated features, denominator on un-rotated ones, against the
    dense oracle built from an independent (complex-number) rotation."""
    grid, blocks, B, H, D = (3, 4, 5), (1, 2, 2), 2, 2, 8
    M = math.prod(blocks)
    q, k, v = rand_inputs(B, grid, H, D, positive=False)
    angle = torch.rand(math.prod(grid), D // 2, dtype=torch.float64) * 6.3
    mix = torch.rand((H, M, M) if per_head else (M, M), dtype=torch.float64)
    scale = None if normalize else 0.37
    got = mhla_reference(q, k, v, mix, grid, blocks, normalize=normalize, scale=scale, feature_map="relu",
                         rope=(angle.cos(), angle.sin()))
    qf, kf = q.relu(), k.relu()
    num = mhla_dense(_complex_rotate(qf, angle), _complex_rotate(kf, angle), v, mix, grid, blocks, normalize=False)
    if normalize:
        den = mhla_dense(qf, kf, torch.ones_like(v), mix, grid, blocks, normalize=False)
        want = num / (den + 1e-6)
    else:
        want = num * scale
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    plain = mhla_reference(q, k, v, mix, grid, blocks, normalize=normalize, scale=scale, feature_map="relu")
    assert (got - plain).abs().max() > 1e-3  # the rotation changes the result


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_bad_rope_raises_value_error(backend):
    a = _ok()
    N, D = 12, 16
    cases = [
        ((torch.rand(N, D), torch.rand(N, D)), r"rope cos must be .* shape \(N, D/2\)=\(12, 8\)"),
        ((torch.rand(N, D // 2),), "pair"),
        ((torch.rand(N, D // 2), torch.zeros(N, D // 2, dtype=torch.int64)), "rope sin"),
    ]
    for rope, message in cases:
        with pytest.raises(ValueError, match=message):
            mhla(a["q"], a["k"], a["v"], a["mix"], a["grid"], a["blocks"], backend=backend, rope=rope)
    odd = torch.rand(1, 12, 2, 17)
    with pytest.raises(ValueError, match="even head dim"):
        mhla(odd, odd, odd, a["mix"], a["grid"], a["blocks"], backend=backend,
             rope=(torch.rand(N, 8), torch.rand(N, 8)))

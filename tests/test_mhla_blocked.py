"""The CPU path (kernels/mhla/blocked.py) against the block-by-block reference, on fresh random inputs."""

import importlib
import math

import pytest
import torch

from mediagen.kernels.mhla.blocked import mhla_blocked
from mediagen.kernels.mhla.naive import mhla_reference
from mediagen.kernels.mhla.op import mhla, resolve_backend
from mhla_oracle import mhla_dense

CASES = [  # grid, blocks, H, D, feature_map, rope, normalize, per-head mix
    ((14, 14), (3, 3), 3, 16, "relu", False, True, False),       # ragged blocks (5, 5, 4)
    ((7, 10, 8), (4, 2, 6), 2, 24, "elu1", True, True, True),     # 3D, ragged on every axis, RoPE
    ((141,), (5,), 2, 16, "relu", False, False, False),          # 1D, normalize=False (scale)
    ((5,), (5,), 2, 16, None, True, True, False),                # one token per block
    ((6, 4), (1, 1), 1, 32, "elu1", False, True, False),         # one block: global linear attention
    # every axis splits evenly: the block layout is a reshape and permute, not a padded gather
    ((4, 6, 4), (2, 3, 2), 2, 16, "relu", True, True, False),    # 3D, 2x2x2-token blocks, RoPE (the video layout)
    ((6, 8), (3, 2), 2, 16, "elu1", False, True, True),          # 2D, 2x4-token blocks, per-head mix
    ((12,), (3,), 1, 16, "relu", False, False, False),           # 1D, normalize=False (scale)
]


@pytest.fixture(autouse=True)
def seeded():
    """Tests that draw from the global generator start from a fixed seed, so that a failure reproduces."""
    torch.manual_seed(0)


@pytest.mark.parametrize("form", ["blocked", "quadratic"])
@pytest.mark.parametrize("grid, blocks, H, D, fmap, rope, normalize, per_head", CASES)
def test_blocked_equals_the_dense_oracle(grid, blocks, H, D, fmap, rope, normalize, per_head, form):
    """The forward against the fp64 dense form, whose blocks come from the documented floor rule alone
    (tests/mhla_oracle.py); the reference below shares the package's block layout, the oracle does not."""
    g = torch.Generator().manual_seed(7)
    N, M = math.prod(grid), math.prod(blocks)
    q, k, v = (torch.randn(1, N, H, D, dtype=torch.float64, generator=g) for _ in range(3))
    if fmap is None:
        q, k = q.abs(), k.abs()
    mix = torch.rand((H, M, M) if per_head else (M, M), dtype=torch.float64, generator=g)
    tables = None
    if rope:
        angle = torch.rand(N, D // 2, dtype=torch.float64, generator=g) * 6
        tables = (angle.cos(), angle.sin())
    kw = dict(normalize=normalize, eps=1e-6, feature_map=fmap, scale=None if normalize else 0.3, rope=tables)
    torch.testing.assert_close(mhla_blocked(q, k, v, mix, grid, blocks, **kw, form=form),
                               mhla_dense(q, k, v, mix, grid, blocks, **kw), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("form", ["blocked", "quadratic"])
@pytest.mark.parametrize("grid, blocks, H, D, fmap, rope, normalize, per_head", CASES)
def test_blocked_equals_the_reference_forward_and_backward(grid, blocks, H, D, fmap, rope, normalize, per_head, form):
    g = torch.Generator().manual_seed(hash((grid, blocks)) % 2**31)
    N, M, B = math.prod(grid), math.prod(blocks), 2
    q, k, v = (torch.randn(B, N, H, D, dtype=torch.float64, generator=g).requires_grad_() for _ in range(3))
    if fmap is None:  # feature_map=None needs positive q, k
        q, k = (t.detach().abs().requires_grad_() for t in (q, k))
    mix = torch.rand((H, M, M) if per_head else (M, M), dtype=torch.float64, generator=g).requires_grad_()
    tables = None
    if rope:
        angle = torch.rand(N, D // 2, dtype=torch.float64, generator=g) * 6
        tables = (angle.cos(), angle.sin())
    kw = dict(normalize=normalize, eps=1e-6, feature_map=fmap, scale=None if normalize else 0.3, rope=tables)
    want = mhla_reference(q, k, v, mix, grid, blocks, **kw)
    got = mhla_blocked(q, k, v, mix, grid, blocks, **kw, form=form)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    with torch.no_grad():  # (nothing differentiated: the quadratic form works in place)
        torch.testing.assert_close(mhla_blocked(q, k, v, mix, grid, blocks, **kw, form=form), want.detach(),
                                   rtol=1e-10, atol=1e-12)
    w = torch.randn(want.shape, dtype=torch.float64, generator=g)
    g_want = torch.autograd.grad((want * w).sum(), (q, k, v, mix))
    g_got = torch.autograd.grad((got * w).sum(), (q, k, v, mix))
    for name, a, b in zip("q k v mix".split(), g_got, g_want):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, msg=lambda m, n=name: f"d{n}: {m}")


def test_low_precision_inputs_accumulate_in_fp32_and_return_their_dtype():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 48, 2, 16, generator=g) for _ in range(3))
    mix = torch.rand(4, 4, generator=g)
    want = mhla_reference(q.double(), k.double(), v.double(), mix.double(), (6, 8), (2, 2), feature_map="relu")
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 3e-2)):
        got = mhla_blocked(q.to(dtype), k.to(dtype), v.to(dtype), mix, (6, 8), (2, 2), feature_map="relu")
        assert got.dtype == dtype
        assert (got.double() - want).norm() / want.norm() < tol


def test_cpu_tensors_take_the_blocked_path_and_the_others_stay_selectable(monkeypatch):
    assert resolve_backend(None, torch.device("cpu")) == "blocked"
    assert resolve_backend(None, torch.device("cuda")) == "triton"
    monkeypatch.setenv("MEDIAGEN_MHLA_BACKEND", "reference")
    assert resolve_backend(None, torch.device("cpu")) == "reference"
    q = torch.randn(1, 12, 2, 16)
    calls = []
    op = importlib.import_module("mediagen.kernels.mhla.op")
    monkeypatch.setattr(op, "mhla_blocked", lambda *a, **kw: calls.append("blocked") or mhla_blocked(*a, **kw))
    monkeypatch.delenv("MEDIAGEN_MHLA_BACKEND")
    mhla(q, q, q, torch.eye(4), (3, 4), (2, 2), feature_map="relu")
    assert calls == ["blocked"]
    with pytest.raises(ValueError, match="backend='fast' is not allowed"):
        mhla(q, q, q, torch.eye(4), (3, 4), (2, 2), feature_map="relu", backend="fast")


def test_triton_on_cpu_tensors_without_the_interpreter_is_refused_by_name(monkeypatch):
    """Triton launches on CUDA tensors, or on CPU tensors only in its interpreter. Forcing it (argument or
    environment) on CPU tensors otherwise is a ValueError naming the backend and the device, not Triton's own
    failure deep in a launch ("0 active drivers")."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q = torch.randn(1, 12, 2, 16)
    with pytest.raises(ValueError, match="backend='triton'.*cpu"):
        mhla(q, q, q, torch.eye(4), (3, 4), (2, 2), feature_map="relu", backend="triton")
    monkeypatch.setenv("MEDIAGEN_MHLA_BACKEND", "triton")
    with pytest.raises(ValueError, match="backend='triton'.*cpu"):
        mhla(q, q, q, torch.eye(4), (3, 4), (2, 2), feature_map="relu")
    want = mhla(q, q, q, torch.eye(4), (3, 4), (2, 2), feature_map="relu", backend="reference")
    assert torch.equal(mhla(q, q, q, torch.eye(4), (3, 4), (2, 2), feature_map="relu", backend="blocked"),
                       mhla_blocked(q, q, q, torch.eye(4), (3, 4), (2, 2), feature_map="relu"))
    assert (mhla(q, q, q, torch.eye(4), (3, 4), (2, 2), feature_map="relu", backend="blocked") - want).abs().max() < 1e-5


@pytest.mark.parametrize("backend", ["blocked", "reference"])
def test_an_unknown_algorithm_is_refused_on_every_path(backend):
    """``algorithm`` picks the Triton forward; a misspelt one is refused where the PyTorch paths run too, not only
    once the same call reaches a GPU."""
    q = torch.randn(1, 12, 2, 16)
    with pytest.raises(ValueError, match="algorithm='dens' is not allowed"):
        mhla(q, q, q, torch.eye(4), (3, 4), (2, 2), feature_map="relu", backend=backend, algorithm="dens")
    for algorithm in ("auto", "chunked", "dense"):  # the PyTorch paths take every Triton choice (and ignore it)
        mhla(q, q, q, torch.eye(4), (3, 4), (2, 2), feature_map="relu", backend=backend, algorithm=algorithm)


def test_short_sequences_take_the_quadratic_form(monkeypatch):
    """"auto" takes the quadratic form where it does at most 3x the blocked form's multiply-adds (the class-to-image
    model's 196 tokens, D = 64, 9 blocks) and the blocked form for long sequences, huge score tensors and in traced
    code; an unknown form is refused."""
    blocked = importlib.import_module("mediagen.kernels.mhla.blocked")
    assert blocked.quadratic_pays(B=2, N=196, H=3, D=64, M=9)
    assert not blocked.quadratic_pays(B=2, N=784, H=3, D=64, M=9)
    assert not blocked.quadratic_pays(B=2, N=1024, H=6, D=64, M=16)  # the video model's grid
    assert not blocked.quadratic_pays(B=4096, N=196, H=3, D=64, M=9)  # 4.7e8 scores
    taken = []
    monkeypatch.setattr(blocked, "_quadratic", lambda *a: taken.append(1) or torch.zeros(()))
    q = torch.randn(2, 196, 3, 64)
    mhla(q, q, q, torch.rand(9, 9), (14, 14), (3, 3), feature_map="relu")
    assert taken == [1]
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)  # traced code keeps the blocked form
    mhla(q, q, q, torch.rand(9, 9), (14, 14), (3, 3), feature_map="relu")
    assert taken == [1]
    with pytest.raises(ValueError, match="form='dense' is not allowed"):
        mhla_blocked(q, q, q, torch.rand(9, 9), (14, 14), (3, 3), form="dense")


def test_quadratic_form_reuses_its_pair_weights_until_mc_changes():
    """Without gradients the quadratic form keeps Mc's per-pair weights on Mc and reuses them while Mc is unchanged;
    an in-place write to Mc makes them again (the output follows it); with gradients they are made in the graph
    and Mc gets its gradient, equal to the reference's."""
    blocked = importlib.import_module("mediagen.kernels.mhla.blocked")
    grid, blocks = (7, 6), (3, 2)
    q, k, v = (torch.randn(2, 42, 2, 8, dtype=torch.float64) for _ in range(3))
    mix = torch.nn.Parameter(torch.rand(2, 6, 6, dtype=torch.float64))
    args = dict(feature_map="relu", form="quadratic")
    with torch.no_grad():
        first = mhla_blocked(q, k, v, mix, grid, blocks, **args)
        kept = mix._mediagen_pairs[-1]
        again = mhla_blocked(q, k, v, mix, grid, blocks, **args)
        assert mix._mediagen_pairs[-1] is kept and torch.equal(again, first)
        mix.mul_(0.5).add_(torch.eye(6, dtype=torch.float64))
        changed = mhla_blocked(q, k, v, mix, grid, blocks, **args)
        assert mix._mediagen_pairs[-1] is not kept
    want = mhla_reference(q, k, v, mix.detach(), grid, blocks, feature_map="relu")
    assert torch.allclose(changed, want, rtol=1e-10, atol=1e-12) and not torch.allclose(first, want)
    o = mhla_blocked(q, k, v, mix, grid, blocks, **args)
    (grad,) = torch.autograd.grad(o.square().sum(), mix)
    ref = mix.detach().clone().requires_grad_()
    (ref_grad,) = torch.autograd.grad(mhla_reference(q, k, v, ref, grid, blocks, feature_map="relu").square().sum(), ref)
    assert torch.allclose(grad, ref_grad, rtol=1e-9, atol=1e-12)
    assert blocked._pair_weights(mix, blocked._token_ids(grid, blocks, q.device), torch.float64).requires_grad


@pytest.mark.parametrize("fmap, rope, normalize, scale", [("relu", True, True, None), ("elu1", False, True, None),
                                                         (None, True, False, 0.3), ("relu", False, False, None)])
def test_sampling_form_of_even_blocks_equals_the_differentiable_form(monkeypatch, fmap, rope, normalize, scale):
    """Without gradients, blocks that divide the grid take ``_even_blocks_sampling`` (features written block-major,
    RoPE as one complex multiply, o written back in token order by the division), in fp32 and bf16 alike: the same
    values as the form autograd records, in the inputs' dtype, from non-contiguous q, k, v too (chunks of a fused
    projection)."""
    blocked = importlib.import_module("mediagen.kernels.mhla.blocked")
    taken = []
    fast = blocked._even_blocks_sampling
    monkeypatch.setattr(blocked, "_even_blocks_sampling", lambda *a: taken.append(1) or fast(*a))
    grid, blocks, H, D = (4, 6, 4), (2, 3, 2), 2, 16
    N = math.prod(grid)
    qkv = torch.randn(2, N, 3 * H * D).requires_grad_()
    q, k, v = (t.unflatten(2, (H, D)) for t in qkv.chunk(3, dim=-1))
    if fmap is None:
        q, k = q.abs(), k.abs()
    mix = torch.nn.Parameter(torch.rand(math.prod(blocks), math.prod(blocks)))
    angle = torch.rand(N, D // 2) * 6
    kw = dict(normalize=normalize, feature_map=fmap, scale=scale, rope=(angle.cos(), angle.sin()) if rope else None)
    for dtype, tol in ((torch.float32, 1e-6), (torch.bfloat16, 1e-2)):
        args = [t.to(dtype) for t in (q, k, v)]
        want = mhla_blocked(*args, mix, grid, blocks, **kw, form="blocked")  # recorded by autograd: the generic form
        assert want.requires_grad and not taken
        with torch.no_grad():
            got = mhla_blocked(*args, mix, grid, blocks, **kw, form="blocked")
        assert taken == [1] and got.dtype == dtype and got.shape == want.shape
        torch.testing.assert_close(got, want.detach(), rtol=tol, atol=tol)
        taken.clear()

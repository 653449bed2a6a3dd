"""HLA's short path between its projections (``kernels.hla.short``): the Triton kernels against the plain-PyTorch
reference in fp64 on fresh random inputs, the reference against the token-by-token Gated DeltaNet, and the layer
on the kernels against its torch ops and its chunked long path. On a CPU the kernels run in Triton's interpreter
(tests/conftest.py); on a GPU the same tests run unchanged."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from mediagen.text.attention import HLAttention
from mediagen.text.kernels.hla import gdn_recurrent
from mediagen.text.kernels.hla.short import hla_short, hla_short_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def rel_err(got, want):
    assert torch.isfinite(got).all()
    return ((got.double() - want).norm() / want.norm()).item()


def inputs(B, N, H, D, chunk, seed, masked=False, dtype=torch.float32, decay_shift=0.0):
    g = torch.Generator().manual_seed(seed)
    # a column slice of a wider buffer: the kernel follows the row stride
    proj = (torch.randn(B, N, H * (3 * D + 2) + 5, generator=g) * 2)[..., :-5]
    proj[..., 3 * H * D + H:] += decay_shift
    neg_a = -torch.rand(H, generator=g).exp()
    weight = torch.rand(D, generator=g) + 0.5
    mask = None
    if masked:  # right padding of different lengths, and one token dropped inside a row
        mask = torch.ones(B, N, dtype=torch.long)
        mask[0, N - max(1, N // 5):] = 0
        mask[-1, N // 2] = 0
    gate = torch.rand(B, H, N - chunk, generator=g) if N > chunk else None
    to = lambda t: None if t is None else t.to(DEVICE)  # noqa: E731
    return proj.to(DEVICE, dtype), neg_a.to(DEVICE), weight.to(DEVICE), to(mask), to(gate)


@pytest.mark.parametrize("B,N,H,D,chunk,masked,dtype", [
    (1, 77, 12, 32, 256, False, torch.float32),   # a MiniLM-sized layer at a prompt's length
    (2, 45, 3, 24, 32, True, torch.float32),      # a head size that is not a power of two; padding
    (2, 60, 2, 32, 32, True, torch.float32),      # two chunks: the gate and the restart at the second
    (1, 29, 2, 16, 16, False, torch.float32),     # blocks of 16 (the chunk 32 does not divide)
    (2, 29, 2, 32, 16, True, torch.float32),      # blocks of 16 narrower than the head; two chunks, padding
    (2, 64, 2, 64, 32, False, torch.float32),     # two whole chunks, the largest head the kernels take
    (2, 50, 2, 32, 32, True, torch.bfloat16),
    (1, 77, 12, 32, 256, False, torch.bfloat16),  # the walk's products in tf32 on a GPU (bf16 output)
    (1, 33, 2, 32, 32, False, torch.float16),
])
def test_kernels_match_reference(B, N, H, D, chunk, masked, dtype):
    proj, neg_a, weight, mask, gate = inputs(B, N, H, D, chunk, seed=N * 10 + D, masked=masked, dtype=dtype)
    want = hla_short_reference(proj.double(), H, D, neg_a.double(), weight.double(), 1e-5, chunk=chunk, mask=mask,
                               gate=None if gate is None else gate.double())
    got = hla_short(proj, H, D, neg_a, weight, 1e-5, chunk=chunk, mask=mask, gate=gate, backend="triton")
    assert got.dtype == dtype and got.shape == (B, N, H, D)
    assert rel_err(got, want) < (1e-5 if dtype == torch.float32 else 1e-2)


def test_kernels_with_strong_decay_and_long_memory():
    """Decays near 0 (log alpha large) and near 1 (tiny log alpha): exp of cumulative sums at both ends."""
    for shift, seed in ((8.0, 1), (-12.0, 2)):
        proj, neg_a, weight, mask, gate = inputs(2, 70, 2, 32, 64, seed=seed, decay_shift=shift)
        want = hla_short_reference(proj.double(), 2, 32, neg_a.double(), weight.double(), 1e-5, chunk=64,
                                   gate=gate.double())
        got = hla_short(proj, 2, 32, neg_a, weight, 1e-5, chunk=64, gate=gate, backend="triton")
        assert rel_err(got, want) < 1e-5, shift


def test_reference_is_gated_deltanet_and_the_gate_blends_the_first_chunks_state():
    """One chunk: GDN token by token, RMS-normalised. Two: gate 1 gives GDN over everything, gate 0 GDN of
    the second chunk from the zero state, and any gate the blend of the two."""
    torch.manual_seed(0)
    B, N, H, D, C = 2, 11, 2, 8, 6
    proj = torch.randn(B, N, H * (3 * D + 2), dtype=torch.float64)
    neg_a, weight = -torch.rand(H, dtype=torch.float64).exp(), torch.rand(D, dtype=torch.float64) + 0.5
    q, k, v = (proj[..., i * H * D:(i + 1) * H * D].unflatten(-1, (H, D)) for i in range(3))
    q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    beta = torch.sigmoid(proj[..., 3 * H * D:3 * H * D + H])
    log_alpha = F.softplus(proj[..., 3 * H * D + H:]) * neg_a
    full, _ = gdn_recurrent(q, k, v, log_alpha, beta, 1.0)
    second, _ = gdn_recurrent(q[:, C:], k[:, C:], v[:, C:], log_alpha[:, C:], beta[:, C:], 1.0)
    norm = lambda o: F.rms_norm(o, (D,), weight, 1e-6)  # noqa: E731
    one = hla_short_reference(proj[:, :C], H, D, neg_a, weight, 1e-6, chunk=C)
    torch.testing.assert_close(one, norm(full[:, :C]), rtol=1e-10, atol=1e-10)
    gate = torch.rand(B, H, N - C, dtype=torch.float64)
    for g, want in ((torch.ones_like(gate), full[:, C:]), (torch.zeros_like(gate), second),
                    (gate, torch.lerp(second, full[:, C:], gate.transpose(1, 2)[..., None]))):
        got = hla_short_reference(proj, H, D, neg_a, weight, 1e-6, chunk=C, gate=g)
        torch.testing.assert_close(got[:, :C], norm(full[:, :C]), rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(got[:, C:], norm(want), rtol=1e-10, atol=1e-10)


def test_padding_leaves_the_other_tokens_as_without_it():
    """Right padding is a run of identity steps: the kept tokens' outputs equal those of the shorter row."""
    proj, neg_a, weight, _, _ = inputs(1, 40, 2, 32, 64, seed=3)
    mask = torch.ones(1, 40, dtype=torch.long, device=DEVICE)
    mask[:, 31:] = 0
    padded = hla_short(proj, 2, 32, neg_a, weight, 1e-5, chunk=64, mask=mask, backend="triton")
    alone = hla_short(proj[:, :31], 2, 32, neg_a, weight, 1e-5, chunk=64, backend="triton")
    torch.testing.assert_close(padded[:, :31], alone, rtol=1e-5, atol=1e-5)


def layer(chunk, pool, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    m = HLAttention(64, 2, chunk=chunk, pool=pool).eval()
    with torch.no_grad():  # away from the initialisation's identity router and zero A_log
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return m.to(DEVICE, dtype)


@pytest.mark.parametrize("n,masked", [(13, False), (16, True), (29, True), (32, False)])
def test_layer_on_the_kernels_equals_its_torch_ops_and_its_long_path(n, masked):
    """The fp32 layer on the kernels against the same layer in fp64 on its torch ops and on its long path
    (one chunk, and two: "triton" takes the kernels for both)."""
    m = layer(16, 4)
    x = torch.randn(2, n, 64, device=DEVICE)
    mask = None
    if masked:
        mask = torch.ones(2, n, dtype=torch.long, device=DEVICE)
        mask[1, n - 3:] = 0
    with torch.no_grad():
        m.short_backend = "triton"
        got = m(x, mask)
        exact = layer(16, 4).double()
        exact.short_backend = "torch"
        torch_ops = exact(x.double(), mask)
        long = exact._forward_long(x.double(), mask)
    torch.testing.assert_close(torch_ops, long, rtol=1e-9, atol=1e-9)
    assert rel_err(got, torch_ops) < 1e-5


def test_layer_on_the_kernels_in_bfloat16():
    m = layer(32, 8, torch.bfloat16)
    x = torch.randn(2, 50, 64, device=DEVICE, dtype=torch.bfloat16)
    with torch.no_grad():
        m.short_backend = "triton"
        got = m(x)
        m.short_backend = "torch"
        want = m(x)
    assert got.dtype == torch.bfloat16
    assert rel_err(got, want.double()) < 2e-2


def test_auto_takes_the_kernels_on_cuda_without_gradients_only():
    m = layer(16, 4)
    x = torch.randn(1, 9, 64, device=DEVICE)
    m.short_backend = "auto"
    with torch.no_grad():
        assert m._short_kernels(x, 9) == x.is_cuda
        assert not m._short_kernels(x, 17)        # two chunks in fp32: the torch ops (exact products are slower)
        assert m._short_kernels(x.bfloat16(), 17) == x.is_cuda          # in bf16 the walk takes tf32 and pays
    assert not m._short_kernels(x, 9)             # parameters that want gradients are being recorded
    assert not HLAttention(64, 2, chunk=8, pool=4).eval().to(DEVICE)._short_kernels(x, 9)   # chunk 8: no blocks
    with torch.no_grad():  # tensors stand in by their attributes: a float64 layer on a GPU keeps the torch ops
        assert m._short_kernels(SimpleNamespace(is_cuda=True, dtype=torch.float32, requires_grad=False), 9)
        assert not m._short_kernels(SimpleNamespace(is_cuda=True, dtype=torch.float64, requires_grad=False), 9)
    m.short_backend = "triton"
    assert m._short_kernels(x, 9) and m._short_kernels(x, 17)
    m.short_backend = "fast"
    with pytest.raises(ValueError, match="short_backend='fast' is not allowed"):
        m._short_kernels(x, 9)


def test_bad_input_names_the_problem():
    proj, neg_a, weight, _, gate = inputs(1, 40, 2, 32, 32, seed=4)
    with pytest.raises(ValueError, match=r"proj must be \(B, N, H \(3 D \+ 2\)\)"):
        hla_short(proj[..., 1:], 2, 32, neg_a, weight, 1e-5, chunk=32, gate=gate)
    with pytest.raises(ValueError, match="n=40 tokens is not allowed: 1 ... 32"):
        hla_short(proj, 2, 32, neg_a, weight, 1e-5, chunk=16)
    with pytest.raises(ValueError, match=r"gate must be \(B, H, n - C\) = \(1, 2, 8\)"):
        hla_short(proj, 2, 32, neg_a, weight, 1e-5, chunk=32)
    with pytest.raises(ValueError, match="mask must be"):
        hla_short(proj, 2, 32, neg_a, weight, 1e-5, chunk=32, gate=gate, mask=torch.ones(1, 39, device=DEVICE))
    with pytest.raises(ValueError, match="backend='triton' takes head_dim <= 64 and a chunk that 16 divides"):
        hla_short(proj[:, :20], 2, 32, neg_a, weight, 1e-5, chunk=24, backend="triton")
    with pytest.raises(ValueError, match="backend='cuda' is not allowed"):
        hla_short(proj, 2, 32, neg_a, weight, 1e-5, chunk=32, gate=gate, backend="cuda")

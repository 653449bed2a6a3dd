"""MLRA's short-path kernels against their plain-PyTorch references (fp64), on fresh random inputs, and the
short path on them against the torch short path and the long path. On a CPU the kernels run in Triton's
interpreter (tests/conftest.py); on a GPU the same tests run unchanged."""

import pytest
import torch

from mediagen.text.attention import MLRAttention
from mediagen.text.attention.rope import apply_rope_tables, rope_tables
from mediagen.text.kernels.short_prepare import (rope_columns, rope_columns_reference, short_prepare,
                                                 short_prepare_reference)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def rel_err(got, want):
    assert torch.isfinite(got).all()
    return ((got.double() - want).norm() / want.norm()).item()


def tables(positions, d_r, dtype):
    return tuple(t.to(DEVICE) for t in rope_tables(positions, d_r, dtype=dtype))


@pytest.mark.parametrize("B,N,d_q,L,d_l,d_r,dtype", [
    (1, 77, 384, 4, 32, 16, torch.float32),   # MiniLM-sized MLRA at a prompt's length
    (3, 5, 48, 4, 24, 12, torch.float32),     # widths that are not powers of two
    (2, 9, 40, 2, 20, 2, torch.float32),      # the smallest rope part
    (2, 33, 64, 4, 32, 16, torch.bfloat16),
    (2, 16, 64, 4, 32, 16, torch.float16),
])
def test_short_prepare_matches_reference(B, N, d_q, L, d_l, d_r, dtype):
    g = torch.Generator().manual_seed(B * 1000 + N)
    # a column slice of a wider buffer: the kernel follows the row stride
    h = (torch.randn(B, N, d_q + L * d_l + d_r + 7, generator=g) * 3)[..., :-7].to(DEVICE, dtype)
    positions = torch.randperm(N, generator=g) + 5
    cos, sin = tables(positions, d_r, dtype)
    want = short_prepare_reference(h.double(), d_q, L, d_l, cos.double(), sin.double(), 1e-6, 1e-5)
    got = short_prepare(h, d_q, L, d_l, cos, sin, eps_q=1e-6, eps_kv=1e-5, backend="triton")
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    for name, a, b in zip(("c_q", "k"), got, want):
        assert a.dtype == dtype and a.shape == b.shape, name
        assert rel_err(a, b) < tol, name
    # every latent head's key ends with the same rotated rope key
    assert torch.equal(got[1][:, :, 0, d_l:], got[1][:, :, L - 1, d_l:])


def test_short_prepare_reference_is_the_modules_norms_and_rope():
    """The reference against the plain pieces: a weightless RMS norm and ``apply_rope_tables``."""
    torch.manual_seed(0)
    d_q, L, d_l, d_r = 24, 4, 8, 6
    h = torch.randn(2, 5, d_q + L * d_l + d_r, dtype=torch.float64)
    cos, sin = rope_tables(torch.arange(5), d_r, dtype=torch.float64)
    c_q, k = short_prepare_reference(h, d_q, L, d_l, cos, sin, 1e-6, 1e-6)
    rms = torch.nn.RMSNorm(d_q, eps=1e-6, elementwise_affine=False)
    torch.testing.assert_close(c_q, rms(h[..., :d_q]))
    lat = h[..., d_q:d_q + L * d_l].unflatten(-1, (L, d_l))
    torch.testing.assert_close(k[..., :d_l], torch.nn.functional.rms_norm(lat, (d_l,), eps=1e-6))
    rope = apply_rope_tables(h[..., -d_r:], cos, sin)
    for lat_head in range(L):
        torch.testing.assert_close(k[:, :, lat_head, d_l:], rope)


@pytest.mark.parametrize("B,N,H,W,start,d_r,dtype", [
    (1, 77, 24, 48, 32, 16, torch.float32),
    (3, 7, 5, 30, 10, 12, torch.float32),
    (2, 19, 8, 48, 32, 16, torch.bfloat16),
])
def test_rope_columns_matches_reference(B, N, H, W, start, d_r, dtype):
    g = torch.Generator().manual_seed(N * 10 + H)
    q = torch.randn(B, N, H, W, generator=g).to(DEVICE, dtype)
    cos, sin = tables(torch.arange(N) * 3, d_r, dtype)
    want = rope_columns_reference(q.double(), start, cos.double(), sin.double())
    got = rope_columns(q.clone(), start, cos, sin, backend="triton")
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    assert rel_err(got, want) < tol
    outside = torch.ones(W, dtype=torch.bool)
    outside[start:start + d_r] = False
    assert torch.equal(got[..., outside], q[..., outside])          # the other columns are untouched
    torch.testing.assert_close(want[..., start:start + d_r],
                               apply_rope_tables(q.double()[..., start:start + d_r], cos.double()[:, None],
                                                 sin.double()[:, None]))


def test_bad_input_names_the_problem():
    h = torch.randn(1, 4, 10)
    cos, sin = rope_tables(torch.arange(4), 2)
    with pytest.raises(ValueError, match="h has 10 columns"):
        short_prepare(h, 4, 2, 3, cos, sin, eps_q=1e-6, eps_kv=1e-6)
    with pytest.raises(ValueError, match=r"cos and sin must be \(4, d_r\)"):
        short_prepare(h, 4, 2, 2, cos[:3], sin[:3], eps_q=1e-6, eps_kv=1e-6)
    with pytest.raises(ValueError, match="backend='cuda' is not allowed"):
        short_prepare(h, 4, 2, 2, cos, sin, eps_q=1e-6, eps_kv=1e-6, backend="cuda")
    with pytest.raises(ValueError, match="start=9 is not allowed"):
        rope_columns(torch.randn(1, 4, 2, 10), 9, cos, sin)


def make_layer(branches, bias, causal, dtype=torch.float32):
    torch.manual_seed(branches + 2 * bias + 4 * causal)
    m = MLRAttention(64, 4, branches=branches, bias=bias, causal=causal).to(DEVICE, dtype).eval()
    with torch.no_grad():
        torch.nn.init.normal_(m.out_proj.weight, std=0.05)    # zero-initialised: would hide everything
        for norm in (m.q_norm, *m.kv_norms):
            norm.weight.uniform_(0.5, 1.5)
        if bias:
            m.q_up.bias.normal_(std=0.1)
            m.out_proj.bias.normal_(std=0.1)
    return m


@pytest.mark.parametrize("branches", [2, 4])
@pytest.mark.parametrize("bias,causal", [(False, True), (True, False)])
def test_short_path_on_the_kernels_equals_the_torch_ops(branches, bias, causal):
    """The layer with short_backend="triton" against "torch" and against the long path, with a padding
    mask and with explicit positions; "auto" takes the kernels on CUDA without gradients, else the torch ops."""
    m = make_layer(branches, bias, causal)
    x = torch.randn(2, 13, 64, device=DEVICE)
    mask = torch.ones(2, 13, dtype=torch.long, device=DEVICE)
    mask[1, 8:] = 0
    positions = torch.arange(13, device=DEVICE) + 4
    outs = {}
    for backend in ("torch", "triton", "auto"):
        m.short_backend = backend
        with torch.no_grad():
            outs[backend] = [m(x), m(x, attention_mask=mask), m(x, positions=positions)]
    with torch.no_grad():
        long = [m._forward_long(x), m._forward_long(x, mask), m._forward_long(x, positions=positions)]
    for got, want, ref in zip(outs["triton"], outs["torch"], long):
        assert want.abs().max() > 1e-2
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
    for got, want in zip(outs["auto"], outs["triton" if DEVICE == "cuda" else "torch"]):
        assert torch.equal(got, want)
    # recording gradients, "auto" takes the torch ops (the kernels rotate in place)
    m.short_backend = "auto"
    x.requires_grad_(True)
    m(x).sum().backward()
    assert x.grad is not None and x.grad.abs().max() > 0


def test_short_path_on_the_kernels_in_bfloat16():
    m = make_layer(2, True, False, torch.bfloat16)
    x = torch.randn(2, 11, 64, device=DEVICE).bfloat16()
    with torch.no_grad():
        m.short_backend = "triton"
        got = m(x)
        want = m.double()._forward_long(x.double())
    assert got.dtype == torch.bfloat16 and rel_err(got, want) < 3e-2


def test_bad_short_backend_names_the_problem():
    m = make_layer(2, False, True)
    m.short_backend = "cuda"
    with pytest.raises(ValueError, match="short_backend='cuda' is not allowed"):
        m(torch.randn(1, 3, 64, device=DEVICE))
    no_rope = MLRAttention(64, 4, branches=2, rope_dim=0).to(DEVICE)
    no_rope.short_backend = "triton"
    with pytest.raises(ValueError, match="rope_dim=0"):
        no_rope(torch.randn(1, 3, 64, device=DEVICE))


def test_auto_takes_the_kernels_for_cuda_tensors_of_their_dtypes_only():
    """A float64 layer on a GPU keeps its torch ops (the kernels take fp32, fp16 and bf16); the short path and
    decoding ask the same question. Tensors stand in by their attributes, so the rule is checked anywhere."""
    from types import SimpleNamespace

    from mediagen.text.kernels.backends import kernels_serve

    def cuda(dtype):
        return SimpleNamespace(is_cuda=True, dtype=dtype, requires_grad=False)

    assert all(kernels_serve(cuda(dt)) for dt in (torch.float32, torch.float16, torch.bfloat16))
    assert not kernels_serve(cuda(torch.float64))
    assert not kernels_serve(torch.zeros(1))      # a CPU tensor
    m = make_layer(2, False, True)
    m.short_backend = "auto"
    with torch.no_grad():
        assert m._short_kernels(cuda(torch.float32)) and not m._short_kernels(cuda(torch.float64))

"""The fused HLA input pass (normalisations, routed query, gates' scalars, padding, bucket
representatives) against the layer's PyTorch pieces, on seeded random inputs; on a CPU in Triton's
interpreter."""

import pytest
import torch

from mediagen.kernels.switches import use_switches
from mediagen.text.kernels.hla.triton_prepare import hla_prepare_reference, hla_prepare_triton

pytestmark = pytest.mark.usefixtures("one_thread")
ON_GPU = torch.cuda.is_available()
# Inputs come from a generator seeded with SEED, so that a failure reproduces (the messages name the seed).
SEED = 0
NAMES = ("q_hat", "k_hat", "v_pad", "q_route", "beta", "log_alpha", "reps")


@pytest.fixture(autouse=True)
def poison_outputs():
    with use_switches(poison_outputs=True):
        yield


def layer_inputs(B, N, H, D, chunk, pool, seed, dtype=torch.float64):
    """Raw projections as slices of one fused projection output, as the layer produces them."""
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    proj = rnd(B, N, 3 * H * D + 2 * H)
    q, k, v = (proj[..., i * H * D:(i + 1) * H * D].unflatten(-1, (H, D)) for i in range(3))
    beta_raw, decay_raw = proj[..., 3 * H * D:3 * H * D + H], proj[..., 3 * H * D + H:]
    weights = [torch.eye(D, dtype=torch.float64) + 0.3 * rnd(H, D, D) for _ in range(4)]
    a_log, dt_bias = 0.5 * rnd(H), rnd(H)
    return [t.to(dtype) for t in (q, k, v, beta_raw, decay_raw, *weights, a_log, dt_bias)]


@pytest.mark.parametrize("B,N,H,D,chunk,pool", [
    (2, 64, 2, 16, 32, 16),     # whole chunks, nb = 2 per chunk
    (1, 45, 3, 24, 16, 4),      # padding to 48 (3 identity tokens), D not a power of two, pool < 16
    (1, 200, 1, 32, 64, 8),     # padding inside the last bucket group, 32 buckets
])
def test_fused_prepare_matches_the_pytorch_pieces(device, B, N, H, D, chunk, pool):
    seed = SEED
    args = [t.to(device) for t in layer_inputs(B, N, H, D, chunk, pool, seed)]
    want = hla_prepare_reference(*args, chunk, pool)
    got = hla_prepare_triton(*args, chunk, pool, ieee=True)
    for name, g, w in zip(NAMES, got, want):
        assert g.shape == w.shape, name
        assert torch.isfinite(g).all(), f"{name}: unwritten (NaN) elements, seed {seed}"
        torch.testing.assert_close(g.double(), w.double(), rtol=1e-5, atol=1e-5,
                                   msg=lambda m: f"{name}, seed {seed}: {m}")


def test_custom_op_registration(device):
    """Schema and fake implementation of mediagen::hla_prepare agree with the kernel (padding included)."""
    args = [t.float().to(device) for t in layer_inputs(1, 40, 2, 16, 16, 4, SEED)]
    torch.library.opcheck(torch.ops.mediagen.hla_prepare.default, (*args, 16, 4),
                          test_utils=("test_schema", "test_faketensor"))


def test_bad_inputs_name_the_parameter(device):
    args = [t.to(device) for t in layer_inputs(1, 32, 2, 16, 16, 4, 0)]
    with pytest.raises(ValueError, match="^q, k, v must share one shape"):
        hla_prepare_triton(args[0], args[1][:, :8], *args[2:], 16, 4)
    with pytest.raises(ValueError, match="^pool=3 must divide chunk=16"):
        hla_prepare_triton(*args, 16, 3)
    with pytest.raises(ValueError, match="^beta_raw and decay_raw"):
        hla_prepare_triton(*args[:3], args[3][:, :5], *args[4:], 16, 4)


@pytest.mark.skipif(not ON_GPU, reason="bf16 products need the GPU (the interpreter mishandles bf16 dots)")
def test_real_size_bf16():
    """MiniLM heads (12 x 32), 4,000 tokens (padded to 4,096), chunk 256, pool 16, bf16."""
    seed = SEED
    args = [t.cuda() for t in layer_inputs(2, 4000, 12, 32, 256, 16, seed)]
    want = hla_prepare_reference(*args, 256, 16)
    got = hla_prepare_triton(*(t.bfloat16() for t in args), 256, 16)
    for name, g, w in zip(NAMES, got, want):
        err = ((g.double() - w).norm() / w.norm().clamp_min(1e-12)).item()
        assert err < 1e-2, f"{name}: rel err {err:.3g}, seed {seed}"

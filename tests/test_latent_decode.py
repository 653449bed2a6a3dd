"""The split-K latent decode kernel against its plain-PyTorch reference (fp64), on fresh random
inputs, and MLRA's decode step on it against its torch decode step. On a CPU the kernel runs in
Triton's interpreter (tests/conftest.py); on a GPU the same tests run unchanged."""

import pytest
import torch

from mediagen.attention import MLRAttention
from mediagen.kernels.latent_decode import latent_decode, latent_decode_reference
from mediagen.kernels.latent_decode import triton_kernel

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def poison_workspace(monkeypatch):
    monkeypatch.setattr(triton_kernel, "POISON_OUTPUTS", True)


def make(B, L, R, D, E, T, dtype, capacity_extra=5):
    """Inputs as MLRA's decode holds them: the cache is a prefix view of a larger buffer."""
    q = torch.randn(B, L, R, D, device=DEVICE, dtype=dtype)
    qr = torch.randn(B, L, R, E, device=DEVICE, dtype=dtype)
    c = torch.randn(B, T + capacity_extra, L, D, device=DEVICE, dtype=dtype)[:, :T]
    kr = torch.randn(B, T + capacity_extra, E, device=DEVICE, dtype=dtype)[:, :T]
    return q, qr, c, kr


def rel_err(got, want):
    assert torch.isfinite(got).all(), "non-finite output: a split's partial was left unwritten"
    return ((got.double() - want).norm() / want.norm()).item()


@pytest.mark.parametrize("B,L,R,D,E,T,splits", [
    (1, 4, 12, 32, 16, 70, 1),     # MLRA-4 at MiniLM's shape
    (1, 2, 4, 32, 16, 300, 2),     # several 64-token tiles per split: the running max is rescaled
    (2, 4, 6, 24, 12, 100, 3),     # MLRA-2 rows, head dims that are not powers of two, 3 splits
    (1, 4, 5, 16, 16, 100, 7),     # more splits than whole tiles: the last splits hold no token
    (2, 2, 3, 20, 0, 33, 2),       # no rope part
    (1, 4, 17, 40, 8, 1, 4),       # one cached token, more rows than one 16-row tile holds
])
def test_kernel_matches_reference(B, L, R, D, E, T, splits):
    q, qr, c, kr = make(B, L, R, D, E, T, torch.float32)
    scale = (D + E) ** -0.5 * 3.0  # sharper than uniform, so the softmax's max tracking matters
    want = latent_decode_reference(q.double(), qr.double(), c.double(), kr.double(), scale)
    got = latent_decode(q, qr, c, kr, scale, backend="triton", splits=splits)
    assert got.shape == (B, L, R, D) and got.dtype == torch.float32
    assert rel_err(got, want) < 1e-5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kernel_low_precision(dtype):
    q, qr, c, kr = make(2, 4, 8, 32, 16, 90, dtype)
    want = latent_decode_reference(q.double(), qr.double(), c.double(), kr.double(), 0.2)
    got = latent_decode(q, qr, c, kr, 0.2, backend="triton", splits=2)
    assert got.dtype == dtype and rel_err(got, want) < 2e-2


@pytest.mark.parametrize("branches", [2, 4])
def test_mlra_decode_on_the_kernel_equals_torch_decode(branches):
    torch.manual_seed(0)
    layer = MLRAttention(64, 4, branches=branches).to(DEVICE).eval()
    torch.nn.init.normal_(layer.out_proj.weight, std=0.05)  # zero-initialised: would hide everything
    x = torch.randn(2, 9, 64, device=DEVICE)
    outs = {}
    assert layer.decode_backend == "auto"  # the default: the kernel on CUDA, the torch ops elsewhere
    for backend in ("torch", "triton", "auto"):
        layer.decode_backend = backend
        cache = layer.new_cache(2, 16)
        with torch.no_grad():
            layer(x[:, :6], cache=cache)                         # prefill 6 tokens
            outs[backend] = torch.cat([layer(x[:, t:t + 1], cache=cache) for t in range(6, 9)], 1)
    torch.testing.assert_close(outs["triton"], outs["torch"], rtol=1e-4, atol=1e-6)
    assert torch.equal(outs["auto"], outs["triton" if DEVICE == "cuda" else "torch"])
    assert outs["torch"].abs().max() > 1e-3


def test_bad_input_names_the_problem():
    q, qr, c, kr = make(1, 4, 3, 16, 8, 10, torch.float32)
    with pytest.raises(ValueError, match="backend='cuda' is not allowed"):
        latent_decode(q, qr, c, kr, 1.0, backend="cuda")
    with pytest.raises(ValueError, match="latents has shape"):
        latent_decode(q, qr, c[:, :, :2], kr, 1.0)
    with pytest.raises(ValueError, match="rope_keys"):
        latent_decode(q, qr, c, kr[:, :5], 1.0)
    with pytest.raises(ValueError, match="one dtype"):
        latent_decode(q, qr.double(), c, kr, 1.0)
    with pytest.raises(ValueError, match="T=0"):
        latent_decode(q, qr, c[:, :0], kr[:, :0], 1.0)
    layer = MLRAttention(64, 4)
    layer.decode_backend = "flash"
    with pytest.raises(ValueError, match="decode_backend='flash'"):
        layer(torch.randn(1, 1, 64), cache=layer.new_cache(1, 4))

"""The split-K latent decode kernels and the decode-step prepare kernel against their plain-PyTorch
references (fp64), on fresh random inputs, and MLRA's absorbed-weight decode step on them against its
torch decode step and its full forward. On a CPU the kernels run in Triton's interpreter
(tests/conftest.py); on a GPU the same tests run unchanged."""

import pytest
import torch

from mediagen.kernels.switches import use_switches
from mediagen.text.attention import MLRAttention
from mediagen.text.attention.rope import rope_tables
from mediagen.text.kernels.latent_decode import (decode_prepare, decode_prepare_reference, latent_decode,
                                            latent_decode_reference)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def poison_workspace():
    with use_switches(poison_outputs=True):
        yield


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


def rotation_row(E, position, dtype):
    """(cos_full, sin_signed) of one position, as MLRA's cache tables hold them."""
    cos, sin = rope_tables(torch.tensor([position], device=DEVICE), E, dtype=dtype)
    return cos[0], sin[0]


@pytest.mark.parametrize("B,L,G,R,D,E,T,splits", [
    (1, 4, 1, 12, 32, 16, 70, 2),    # MLRA-4: every latent reads the same rope rows, no expanded copy
    (2, 4, 2, 6, 24, 12, 100, 3),    # MLRA-2: latents alternate between two head halves
    (1, 2, 2, 3, 16, 8, 5, 1),
])
def test_kernel_rope_groups_and_rotation(B, L, G, R, D, E, T, splits):
    q, _, c, kr = make(B, L, R, D, E, T, torch.float32)
    qr = torch.randn(B, G, R, E, device=DEVICE)
    rot = rotation_row(E, 37, torch.float32)
    scale = (D + E) ** -0.5 * 3.0
    want = latent_decode_reference(q.double(), qr.double(), c.double(), kr.double(), scale,
                                   tuple(t.double() for t in rot))
    got = latent_decode(q, qr, c, kr, scale, backend="triton", splits=splits, rope_rotation=rot)
    assert rel_err(got, want) < 1e-5
    # the rotation and the groups change the result: the test can fail
    plain = latent_decode_reference(q.double(), qr.double(), c.double(), kr.double(), scale)
    assert rel_err(plain, want) > 1e-3


def prepare_inputs(B, d_q, L, d_l, d_r, dtype, capacity=9, position=5):
    h = torch.randn(B, d_q + L * d_l + d_r + 3, device=DEVICE, dtype=dtype)[:, 3:] * 2.0  # a strided view
    q_weight = torch.rand(d_q, device=DEVICE) + 0.5
    kv_weight = torch.rand(L, d_l, device=DEVICE) + 0.5
    latents = torch.full((B, capacity, L, d_l), float("nan"), device=DEVICE, dtype=dtype)
    rope = torch.full((B, capacity, d_r), float("nan"), device=DEVICE, dtype=dtype)
    return h, q_weight, kv_weight, rotation_row(d_r, position, dtype), latents, rope


@pytest.mark.parametrize("B,d_q,L,d_l,d_r,dtype", [
    (2, 64, 4, 16, 8, torch.float32),
    (1, 48, 4, 24, 12, torch.float32),   # widths that are not powers of two
    (3, 32, 4, 8, 0, torch.float32),     # no rope part
    (2, 64, 4, 32, 16, torch.bfloat16),
])
def test_prepare_kernel_matches_reference(B, d_q, L, d_l, d_r, dtype):
    h, qw, kvw, rot, latents, rope = prepare_inputs(B, d_q, L, d_l, d_r, dtype)
    want_lat, want_rope = latents.double().clone(), rope.double().clone()
    want = decode_prepare_reference(h.double(), qw.double(), kvw.double(), tuple(t.double() for t in rot),
                                    want_lat[:, 5], want_rope[:, 5], 1e-6, 1e-5)
    got = decode_prepare(h, qw, kvw, rot, latents[:, 5], rope[:, 5], eps_q=1e-6, eps_kv=1e-5, backend="triton")
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert got.dtype == dtype and rel_err(got, want) < tol
    assert rel_err(latents[:, 5], want_lat[:, 5]) < tol
    if d_r:
        assert rel_err(rope[:, 5], want_rope[:, 5]) < tol
    # only the new token's slot was written
    assert torch.isnan(latents[:, :5]).all() and torch.isnan(latents[:, 6:]).all() and torch.isnan(rope[:, 6:]).all()


def test_prepare_reference_is_the_modules_norms_and_rope():
    """The reference against MLRA's own pieces: nn.RMSNorm with its scale, and apply_rope_tables."""
    torch.manual_seed(0)
    layer = MLRAttention(64, 4, branches=4).double()
    for norm in (layer.q_norm, *layer.kv_norms):
        torch.nn.init.uniform_(norm.weight, 0.5, 1.5)
    x = torch.randn(2, 1, 64, dtype=torch.float64)
    cos, sin = rope_tables(torch.tensor([3]), layer.rope_dim, dtype=torch.float64)
    c_want, k_want = layer._latents(x, cos[:, None, :], sin[:, None, :])
    cq_want = layer.q_norm(layer.q_down(x)) * layer.q_scale
    h = torch.cat([layer.q_down(x), layer.kv_down(x)], -1)[:, 0]
    lat = torch.zeros(2, 4, layer.latent_dim, dtype=torch.float64)
    rope = torch.zeros(2, layer.rope_dim, dtype=torch.float64)
    with torch.no_grad():
        w = layer._absorbed_weights()
        cq = decode_prepare_reference(h, w["q_norm"], w["kv_norm"], (cos[0], sin[0]), lat, rope, 1e-6, 1e-6)
    torch.testing.assert_close(cq, cq_want[:, 0].detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lat, c_want[:, 0].detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(rope, k_want[:, 0].detach(), rtol=1e-12, atol=1e-12)


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


@pytest.mark.parametrize("branches", [2, 4])
def test_absorbed_decode_equals_full_forward(branches):
    """The absorbed-weight step (decode_backend="triton") token by token equals the full forward, with
    query and output biases; after a weight changes in place the step follows it (no stale weights)."""
    torch.manual_seed(1)
    layer = MLRAttention(64, 4, branches=branches, bias=True).to(DEVICE).eval()
    for p in (layer.out_proj.weight, layer.q_up.bias, layer.out_proj.bias):
        torch.nn.init.normal_(p, std=0.1)
    for norm in (layer.q_norm, *layer.kv_norms):
        torch.nn.init.uniform_(norm.weight, 0.5, 1.5)
    layer.decode_backend = "triton"
    x = torch.randn(2, 7, 64, device=DEVICE)
    with torch.no_grad():
        for step in range(2):
            full = layer(x)
            cache = layer.new_cache(2, 10)
            pre = layer(x[:, :3], cache=cache)
            steps = [layer(x[:, t:t + 1], cache=cache) for t in range(3, 7)]
            torch.testing.assert_close(torch.cat([pre, *steps], 1), full, rtol=1e-4, atol=1e-5)
            assert cache.length == 7
            layer.kv_up.mul_(1.5)  # in place: the second round must see it
            layer.q_up.bias.add_(0.2)
        with pytest.raises(ValueError, match="capacity"):
            small = layer.new_cache(2, 1)
            layer(x[:, :1], cache=small)
            layer(x[:, 1:2], cache=small)


def test_failed_absorbed_step_leaves_the_cache_as_it_was(monkeypatch):
    """A step that fails before its slot is written does not count the slot (DecodeCache.next_slot)."""
    import mediagen.text.attention.mlra as mlra_module
    layer = MLRAttention(64, 4).to(DEVICE).eval()
    layer.decode_backend = "triton"
    cache = layer.new_cache(1, 4)
    with torch.no_grad():
        layer(torch.randn(1, 1, 64, device=DEVICE), cache=cache)

        def broken(*args, **kwargs):
            raise RuntimeError("kernel failed")
        monkeypatch.setattr(mlra_module, "decode_prepare", broken)
        with pytest.raises(RuntimeError, match="kernel failed"):
            layer(torch.randn(1, 1, 64, device=DEVICE), cache=cache)
    assert cache.length == 1


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
    with pytest.raises(ValueError, match="G dividing 4"):
        latent_decode(q, qr[:, :3], c, kr, 1.0)
    with pytest.raises(ValueError, match="rope_rotation"):
        latent_decode(q, qr, c, kr, 1.0, rope_rotation=(torch.ones(3), torch.ones(3)))
    h, qw, kvw, rot, latents, rope = prepare_inputs(1, 16, 4, 8, 4, torch.float32)
    with pytest.raises(ValueError, match="h has 51 columns"):
        decode_prepare(h[:, 1:], qw, kvw, rot, latents[:, 0], rope[:, 0], eps_q=1e-6, eps_kv=1e-6)
    with pytest.raises(ValueError, match="latent_slot"):
        decode_prepare(h, qw, kvw, rot, latents[:, 0, :2], rope[:, 0], eps_q=1e-6, eps_kv=1e-6)
    with pytest.raises(ValueError, match="backend='cuda'"):
        decode_prepare(h, qw, kvw, rot, latents[:, 0], rope[:, 0], eps_q=1e-6, eps_kv=1e-6, backend="cuda")
    with pytest.raises(ValueError, match="one device"):
        decode_prepare(h, qw.to("meta"), kvw, rot, latents[:, 0], rope[:, 0], eps_q=1e-6, eps_kv=1e-6)
    layer = MLRAttention(64, 4)
    layer.decode_backend = "flash"
    with pytest.raises(ValueError, match="decode_backend='flash'"):
        layer(torch.randn(1, 1, 64), cache=layer.new_cache(1, 4))

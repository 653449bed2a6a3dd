"""The fused Triton HLA readout (gates on chip + walk over past chunks) against the unfused fp64
reference, on seeded random inputs. On a CPU it runs in Triton's interpreter (tests/conftest.py), so
the shapes are small; on a GPU the same tests run, plus a real size in bf16 with tf32 products."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from mediagen.kernels.switches import use_switches
from mediagen.text.attention.hla import HLAttention
from mediagen.text.kernels.hla import bucket_representatives, chunk_summaries
from mediagen.text.kernels.hla.readout import hla_readout_reference
from mediagen.text.kernels.hla.router import chunk_routing_order
from mediagen.text.kernels.hla.triton_readout import hla_readout_triton

pytestmark = pytest.mark.usefixtures("one_thread")
ON_GPU = torch.cuda.is_available()


@pytest.fixture(autouse=True)
def poison_outputs():
    with use_switches(poison_outputs=True):
        yield


# Every test draws its inputs from this seed, through its own generator or torch's global one (seeded below), so a
# failure reproduces: the messages name the seed, and a rerun draws the same inputs.
SEED = 0


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(SEED)


def problem(B, H, nc, C, K, V, D, pool, device, seed):
    """Summaries of a random GDN sequence (fp64), a routed query and bucket representatives."""
    g = torch.Generator().manual_seed(seed)
    n = nc * C
    rnd = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    q, k = F.normalize(rnd(B, n, H, K), dim=-1), F.normalize(rnd(B, n, H, K), dim=-1)
    v = rnd(B, n, H, V)
    log_alpha = -0.2 * torch.rand(B, n, H, generator=g, dtype=torch.float64)
    beta = torch.rand(B, n, H, generator=g, dtype=torch.float64)
    o_intra, r, a, b = chunk_summaries(q, k, v, log_alpha, beta, K ** -0.5, C)
    q_route = rnd(B, n, H, D)
    w = [torch.eye(D, dtype=torch.float64) + 0.3 * rnd(H, D, D) for _ in range(3)]
    reps = bucket_representatives(rnd(B, n, H, D), *w, C, pool)
    return [t.to(device) for t in (o_intra, r, a, b, q_route, reps)]


def rel_err(got, want):
    assert torch.isfinite(got).all(), "readout left unwritten (NaN) or non-finite elements"
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


CASES = [  # B, H, nC, C, K, V, D, pool, block_tokens
    (2, 2, 5, 8, 16, 16, 16, 4, None),       # nb = 2 buckets (padded to 16 lanes), C < one tile
    (1, 3, 4, 24, 24, 20, 24, 8, 16),        # dims not powers of two, K != V, ragged last token tile
    (1, 1, 6, 32, 32, 32, 32, 2, 8),         # nb = 16, four token tiles per chunk
]


@pytest.mark.parametrize("B,H,nc,C,K,V,D,pool,bt", CASES)
@pytest.mark.parametrize("listed", [False, True])
def test_fused_readout_matches_reference(device, B, H, nc, C, K, V, D, pool, bt, listed):
    seed = SEED
    o_intra, r, a, b, q_route, reps = problem(B, H, nc, C, K, V, D, pool, device, seed)
    bias = 0.7
    order = None
    if listed:  # top-2 routing, plus a hole (-1) in the middle of one list
        order = chunk_routing_order(q_route, reps, C, 2)
        order[0, 0, -1, 0] = -1
    want = hla_readout_reference(o_intra, r, a, b, q_route, reps, bias, order)
    got = hla_readout_triton(*(t.float() for t in (o_intra, r, a, b, q_route, reps)), bias, order, ieee=True,
                             block_tokens=bt)
    assert got.shape == want.shape and got.dtype == torch.float32
    assert rel_err(got, want) < 1e-5, f"seed {seed}"
    # the walk matters: dropping it (o_intra alone) is far from the answer
    assert rel_err(o_intra, want) > 1e-2


def test_reading_in_place_through_strides(device):
    """Non-contiguous views (as fla's summaries and a (B, N, H, D) routed query arrive) read correctly."""
    seed = SEED
    o_intra, r, a, b, q_route, reps = problem(1, 2, 3, 16, 16, 16, 16, 4, device, seed)
    want = hla_readout_reference(o_intra, r, a, b, q_route, reps, 0.3)
    views = [t.float().transpose(-1, -2).contiguous().transpose(-1, -2) for t in (o_intra, r, a, b, reps)]
    q_nc = q_route.float().transpose(1, 2).contiguous().transpose(1, 2)
    assert not views[0].is_contiguous() and not q_nc.is_contiguous()
    got = hla_readout_triton(*views[:4], q_nc, views[4], 0.3, ieee=True)
    assert rel_err(got, want) < 1e-5, f"seed {seed}"


def test_fused_rms_norm_into_a_token_major_buffer(device):
    """norm_weight applies nn.RMSNorm's formula in the epilogue; out= writes through a permuted view of a
    (B, nC*C, H, V) bf16 buffer, the layout the layer's output projection reads."""
    seed = SEED
    B, H, nc, C, V = 2, 2, 3, 16, 24
    o_intra, r, a, b, q_route, reps = problem(B, H, nc, C, 16, V, 16, 4, device, seed)
    weight = torch.rand(V, dtype=torch.float64, device=device) + 0.5
    want = F.rms_norm(hla_readout_reference(o_intra, r, a, b, q_route, reps, 0.4), (V,), weight, 1e-5)
    want = want.permute(0, 2, 3, 1, 4).reshape(B, nc * C, H, V)
    buf = torch.full((B, nc * C, H, V), float("nan"), dtype=torch.bfloat16, device=device)
    view = buf.view(B, nc, C, H, V).permute(0, 3, 1, 2, 4)
    hla_readout_triton(*(t.float() for t in (o_intra, r, a, b, q_route, reps)), 0.4, ieee=True,
                       norm_weight=weight.float(), norm_eps=1e-5, out=view)
    assert rel_err(buf, want) < 1e-2, f"seed {seed}"          # bf16 rounding of the stored values
    with pytest.raises(ValueError, match="^norm_weight must have shape"):
        hla_readout_triton(*(t.float() for t in (o_intra, r, a, b, q_route, reps)), 0.4, norm_weight=weight[:3])
    with pytest.raises(ValueError, match="^out must be"):
        hla_readout_triton(*(t.float() for t in (o_intra, r, a, b, q_route, reps)), 0.4, out=buf)


@pytest.mark.parametrize("route,top_k", [("token", None), ("chunk", 2)])
def test_layer_fused_readout_equals_unfused(device, route, top_k):
    seed = SEED
    torch.manual_seed(seed)
    layer = HLAttention(32, 2, chunk=16, pool=4, top_k=top_k, route=route, backend="torch").to(device).eval()
    x = torch.randn(2, 70, 32, device=device)                        # 5 chunks, the last one padded
    with torch.no_grad():
        for w in (layer.route_q, layer.pool_k, layer.pool_v, layer.pool_o):   # router weights off identity
            w.add_(0.3 * torch.randn_like(w))
        layer.readout = "torch"
        want = layer(x)
        layer.readout = "triton"
        got = layer(x)
    # the GPU multiplies fp32 in tf32 (10-bit mantissa), the interpreter exactly
    assert rel_err(got, want) < (2e-3 if x.is_cuda else 1e-4), f"seed {seed}"


def test_layer_fused_readout_with_padding_mask(device):
    """Masked (padded) tokens are identity steps in both paths; real tokens agree."""
    seed = SEED
    torch.manual_seed(seed)
    layer = HLAttention(32, 2, chunk=16, pool=4, backend="torch").to(device).eval()
    x = torch.randn(2, 64, 32, device=device)
    mask = torch.ones(2, 64, device=device)
    mask[1, 41:] = 0
    with torch.no_grad():
        layer.readout = "torch"
        want = layer(x, attention_mask=mask)
        layer.readout = "triton"
        got = layer(x, attention_mask=mask)
    assert rel_err(got[0], want[0]) < (2e-3 if x.is_cuda else 1e-4), f"seed {seed}"
    assert rel_err(got[1, :41], want[1, :41]) < (2e-3 if x.is_cuda else 1e-4), f"seed {seed}"


@pytest.mark.skipif(not ON_GPU, reason="flash-linear-attention's kernels need the GPU")
def test_layer_fused_readout_on_fla_summaries():
    """The GPU default: fla's (strided, bf16 / fp32) summaries feeding the fused readout, bf16 layer."""
    pytest.importorskip("fla")
    seed = SEED
    torch.manual_seed(seed)
    layer = HLAttention(384, 12, backend="fla").cuda().to(torch.bfloat16).eval()
    x = torch.randn(2, 2000, 384, device="cuda", dtype=torch.bfloat16)  # 8 chunks of 256, the last padded
    with torch.no_grad():
        layer.readout = "torch"
        want = layer(x)
        layer.readout = "auto"
        got = layer(x)
    assert rel_err(got, want) < 2e-2, f"seed {seed}"


def test_custom_op_registration(device):
    """Schema and fake implementation of mediagen::hla_readout_tokens agree with the kernel."""
    o_intra, r, a, b, q_route, reps = (t.float() for t in problem(1, 2, 3, 8, 16, 16, 16, 4, device, SEED))
    order = chunk_routing_order(q_route, reps, 8, 1)
    args = (o_intra, r, a, b, q_route, reps, order, torch.ones(16, device=device), 0.5, 1e-6)
    torch.library.opcheck(torch.ops.mediagen.hla_readout_tokens.default, args,
                          test_utils=("test_schema", "test_faketensor"))


def test_compiled_layer_has_no_graph_break(device):
    """torch.compile traces the whole inference forward, fused readout included, in one graph."""
    seed = SEED
    torch.manual_seed(seed)
    layer = HLAttention(32, 2, chunk=16, pool=4, backend="torch", readout="triton").to(device).eval()
    x = torch.randn(1, 48, 32, device=device)
    with torch.no_grad():
        want = layer(x)
        got = torch.compile(layer, fullgraph=True, backend="aot_eager")(x)
    assert rel_err(got, want) < 1e-5, f"seed {seed}"


def test_layer_refuses_the_kernel_where_it_cannot_serve(device):
    layer = HLAttention(32, 2, chunk=16, pool=4, readout="triton").to(device)
    x = torch.randn(1, 40, 32, device=device)
    with pytest.raises(ValueError, match="gradients are needed"):
        layer(x)
    with torch.no_grad(), pytest.raises(ValueError, match="auxiliary losses"):
        layer(x, return_aux=True)
    layer.eval().top_k = 1
    with torch.no_grad(), pytest.raises(ValueError, match="route='token'"):
        layer(x)
    wide = HLAttention(2 * 160, 2, chunk=16, pool=4, readout="triton").to(device).eval()
    with torch.no_grad(), pytest.raises(ValueError, match="head_dim=160 is above"):
        wide(torch.randn(1, 40, 320, device=device))
    wide.readout = "auto"                                          # auto falls back to the PyTorch path
    with torch.no_grad():
        assert torch.isfinite(wide(torch.randn(1, 40, 320, device=device))).all()
    with pytest.raises(ValueError, match="readout='fast'"):
        HLAttention(32, 2, readout="fast")
    exact = HLAttention(32, 2, chunk=16, pool=4, readout="triton").to(device).double().eval()
    with torch.no_grad(), pytest.raises(ValueError, match="not torch.float64"):
        exact(torch.randn(1, 40, 32, device=device, dtype=torch.float64))
    exact.readout = "auto"        # auto: a float64 layer (on a GPU too) keeps the PyTorch path
    with torch.no_grad():
        assert torch.isfinite(exact(torch.randn(1, 40, 32, device=device, dtype=torch.float64))).all()
        assert not exact._fused_readout(SimpleNamespace(is_cuda=True, dtype=torch.float64, requires_grad=False),
                                        False)
        assert exact._fused_readout(SimpleNamespace(is_cuda=True, dtype=torch.float32, requires_grad=False), False)


def test_bad_inputs_name_the_parameter(device):
    o_intra, r, a, b, q_route, reps = (t.float() for t in problem(1, 1, 2, 8, 16, 16, 16, 4, device, 0))
    with pytest.raises(ValueError, match="^a has shape"):
        hla_readout_triton(o_intra, r, a[..., :8], b, q_route, reps, 0.0)
    with pytest.raises(ValueError, match="^q_route must be"):
        hla_readout_triton(o_intra, r, a, b, q_route[:, :8], reps, 0.0)
    with pytest.raises(ValueError, match="^reps .* must share one dtype"):
        hla_readout_triton(o_intra, r, a, b, q_route, reps.double(), 0.0)
    with pytest.raises(ValueError, match="^order must hold integer"):
        hla_readout_triton(o_intra, r, a, b, q_route, reps, 0.0, order=torch.zeros(1, 1, 2, 1, device=device))


@pytest.mark.skipif(not ON_GPU, reason="real size needs the GPU")
def test_real_size_bf16_tensor_cores():
    """MiniLM heads (12 x 32), 8,192 tokens, chunk 256, pool 16: bf16 routed query, tf32 walk."""
    seed = SEED
    o_intra, r, a, b, q_route, reps = problem(1, 12, 32, 256, 32, 32, 32, 16, "cuda", seed)
    want = hla_readout_reference(o_intra, r, a, b, q_route, reps, 2.2)
    got = hla_readout_triton(o_intra.bfloat16(), r.float(), a.float(), b.float(), q_route.bfloat16(),
                             reps.bfloat16(), 2.2)
    assert rel_err(got, want) < 1e-2, f"seed {seed}"


@pytest.mark.parametrize("map_dtype", [
    pytest.param(torch.bfloat16, marks=pytest.mark.skipif(not ON_GPU, reason="Triton's CPU interpreter "
                 "mishandles bf16 dot operands (errors of 1e11 on inputs where fp16 is within 1e-4)")),
    torch.float16])
def test_half_maps_stay_close_to_reference(device, map_dtype):
    """The walk's products in a half dtype (what bf16 layers use on a GPU): r is rounded to the
    operand dtype each step but accumulates in fp32, so the error stays at the half dtype's level."""
    seed = SEED
    o_intra, r, a, b, q_route, reps = problem(1, 2, 6, 16, 16, 16, 16, 4, device, seed)
    want = hla_readout_reference(o_intra, r, a, b, q_route, reps, 0.5)
    got = hla_readout_triton(*(t.float() for t in (o_intra, r, a, b)), q_route.to(map_dtype), reps.to(map_dtype),
                             0.5, ieee=False, map_dtype=map_dtype)
    err = rel_err(got, want)
    assert err < 2e-2, f"seed {seed}: rel err {err:.3g}"
    with pytest.raises(ValueError, match="^map_dtype="):
        hla_readout_triton(o_intra, r, a, b, q_route, reps, 0.5, map_dtype=torch.float64)

"""HLA: the chunked path against the token-by-token recurrence (fp64), gates in [0, 1], gates of 1
giving Gated DeltaNet exactly, chunk skipping, the regularisers, padding, and the short-sequence path
equal to the chunked one (forward and gradients)."""

import pytest
import torch
import torch.nn.functional as F

from mediagen.text.attention.hla import HLAttention
from mediagen.text.kernels.hla import (bucket_representatives, chunk_summaries, gate_regularisers, gated_delta_rule_chunked, gdn_recurrent,
                                  hla_chunked, hla_recurrent, select_chunks)
from mediagen.text.kernels.hla.chunk import pad_to_chunks
from text_paths import assert_close_fp32, padding_mask, short_and_long


pytestmark = pytest.mark.usefixtures("one_thread")

F64 = torch.float64


def inputs(b=2, n=16, h=2, dk=4, dv=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(b, n, h, dk, generator=g, dtype=F64), dim=-1)
    k = F.normalize(torch.randn(b, n, h, dk, generator=g, dtype=F64), dim=-1)
    v = torch.randn(b, n, h, dv, generator=g, dtype=F64)
    log_alpha = -torch.rand(b, n, h, generator=g, dtype=F64)
    beta = torch.rand(b, n, h, generator=g, dtype=F64)
    return q, k, v, log_alpha, beta


@pytest.mark.parametrize("n,chunk", [(16, 4), (13, 4), (7, 8), (1, 4)])
def test_gdn_chunked_equals_recurrent(n, chunk):
    q, k, v, la, be = inputs(n=n)
    ref, _ = gdn_recurrent(q, k, v, la, be, 0.7)
    torch.testing.assert_close(gated_delta_rule_chunked(q, k, v, la, be, 0.7, chunk=chunk), ref,
                               rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("seed", [0, 1])
def test_hla_chunked_equals_recurrent(seed):
    q, k, v, la, be = inputs(n=16, seed=seed)
    chunk, nc = 4, 4
    gates = torch.rand(2, 2, nc, chunk, nc, generator=torch.Generator().manual_seed(seed + 9), dtype=F64)
    per_token = gates.movedim(1, 3).reshape(2, 16, 2, nc)            # (B, N, H, nC)
    ref = hla_recurrent(q, k, v, la, be, per_token, 0.5, chunk)
    torch.testing.assert_close(hla_chunked(q, k, v, la, be, gates, 0.5, chunk), ref, rtol=1e-10, atol=1e-10)
    # and the gates matter: a different set gives a different answer
    assert not torch.allclose(hla_chunked(q, k, v, la, be, gates.flip(-1), 0.5, chunk), ref)


def test_summaries_are_exact_affine_maps():
    """Running one chunk from a random start state equals r^T h0 + o_intra, and ends at A h0 + b."""
    q, k, v, la, be = inputs(b=1, n=4)
    o_intra, r, a, b = chunk_summaries(q, k, v, la, be, 0.5, 4)
    h0 = torch.randn(1, 2, 4, 3, dtype=F64)
    o_ref, h_ref = gdn_recurrent(q, k, v, la, be, 0.5, h0)
    torch.testing.assert_close((r[:, :, 0] @ h0 + o_intra[:, :, 0]).movedim(1, 2), o_ref)
    torch.testing.assert_close(a[:, :, 0] @ h0 + b[:, :, 0], h_ref)


def test_gates_of_one_reduce_to_gated_deltanet():
    q, k, v, la, be = inputs(n=14)
    ref, _ = gdn_recurrent(q, k, v, la, be, 0.5)
    qp, kp, vp, lap, bep, n = pad_to_chunks(q, k, v, la, be, 4)
    ones = torch.ones(2, 2, 4, 4, 4, dtype=F64)
    torch.testing.assert_close(hla_chunked(qp, kp, vp, lap, bep, ones, 0.5, 4)[:, :n], ref,
                               rtol=1e-10, atol=1e-10)
    # the module, too: learned gates replaced by ones == the same layer as plain GDN
    torch.manual_seed(0)
    m = HLAttention(16, 2, chunk=4, pool=2).double()
    x = torch.randn(2, 14, 16, dtype=F64)
    ones = torch.ones(2, 2, 4, 4, 4, dtype=F64)
    torch.testing.assert_close(m(x, gates_override=ones), m.forward_gdn(x), rtol=1e-10, atol=1e-10)
    assert not torch.allclose(m(x), m.forward_gdn(x))                 # learned gates are not all 1


def test_gates_lie_in_unit_interval_and_cover_only_past_chunks():
    torch.manual_seed(0)
    m = HLAttention(16, 2, chunk=4, pool=2).double()
    for scale in (1.0, 100.0):
        with torch.no_grad():
            m.route_q.mul_(scale)
        x = torch.randn(2, 16, 16, dtype=F64) * scale
        q, k, *_ = m.gdn_inputs(x)
        g = m.gates(q, k)
        assert g.shape == (2, 2, 4, 4, 4)
        assert bool((g >= 0).all()) and bool((g <= 1).all())
        future_or_current = torch.ones(4, 4, dtype=torch.bool).triu()[:, None, :].expand(4, 4, 4)
        assert bool((g[..., future_or_current] == 0).all())
        assert bool((g[:, :, 1:, :, 0] > 0).all())                     # past chunks get a positive gate


def test_sparse_walk_equals_dense_when_all_kept_and_zero_gates_when_skipped():
    q, k, v, la, be = inputs(n=20)
    gates = torch.rand(2, 2, 5, 4, 5, generator=torch.Generator().manual_seed(3), dtype=F64)
    dense = hla_chunked(q, k, v, la, be, gates, 0.5, 4)
    keep_all = select_chunks(gates)
    torch.testing.assert_close(hla_chunked(q, k, v, la, be, gates, 0.5, 4, keep=keep_all), dense)
    torch.testing.assert_close(hla_chunked(q, k, v, la, be, gates, 0.5, 4,
                                           keep=select_chunks(gates, threshold=0.0)), dense)

    keep = select_chunks(gates, top_k=2)
    assert int(keep.sum(-1).max()) == 2
    zeroed = gates * keep[:, :, :, None, :].to(F64)                   # skipping == gate 0
    torch.testing.assert_close(hla_chunked(q, k, v, la, be, gates, 0.5, 4, keep=keep),
                               hla_chunked(q, k, v, la, be, zeroed, 0.5, 4), rtol=1e-10, atol=1e-10)


def test_regularisers_on_a_hand_case():
    # 6 chunks of 2 tokens; only chunk 5 reads its 5 past chunks, all at gate 1 (sum 5, uniform p:
    # effective support 5); chunks 1-4 read nothing (sum 0, support 0). 10 tokens have a past.
    gates = torch.zeros(1, 1, 6, 2, 6, dtype=F64)
    gates[0, 0, 5, :, :5] = 1.0
    reg = gate_regularisers(gates)
    assert reg["budget"].item() == pytest.approx(0.005 * ((5 - 3) / 3) ** 2 * 2 / 10)
    assert reg["support"].item() == pytest.approx(0.001 * (5 - 2) ** 2 * 2 / 10)
    assert reg["binary"].item() == pytest.approx(0.0)
    assert reg["total"].item() == pytest.approx(reg["budget"].item() + reg["support"].item())
    # chunk 1 reads chunk 0 at 0.5: under budget, support 1, binary 0.001 * 0.25
    per_chunk = torch.tensor([[0.0, 0.0], [0.5, 0.0]], dtype=F64)    # (query chunk, past chunk)
    reg = gate_regularisers(per_chunk[None, None, :, None, :].expand(1, 1, 2, 3, 2))
    assert reg["budget"].item() == 0.0
    assert reg["support"].item() == 0.0
    assert reg["binary"].item() == pytest.approx(0.001 * 0.25)


def test_aux_loss_trains_the_router():
    torch.manual_seed(0)
    m = HLAttention(16, 2, chunk=4, pool=2)
    m(torch.randn(2, 24, 16), return_aux=True)
    m.aux_losses["total"].backward()
    assert m.route_q.grad is not None and m.route_q.grad.abs().sum() > 0
    assert m.pool_k.grad is not None and m.pool_k.grad.abs().sum() > 0


def test_right_padding_changes_no_real_token():
    torch.manual_seed(0)
    m = HLAttention(16, 2, chunk=4, pool=2).double()
    x = torch.randn(1, 9, 16, dtype=F64)
    ref = m(x)
    padded = torch.cat([x, torch.randn(1, 6, 16, dtype=F64)], 1)
    mask = torch.tensor([[1] * 9 + [0] * 6])
    torch.testing.assert_close(m(padded, attention_mask=mask)[:, :9], ref, rtol=1e-10, atol=1e-10)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="flash-linear-attention needs CUDA")
def test_fla_summaries_match_torch():
    pytest.importorskip("fla")
    q, k, v, la, be = (t.float().cuda() for t in inputs(b=2, n=128, h=2, dk=64, dv=64))
    ref = chunk_summaries(q, k, v, la, be, 0.125, 64, backend="torch")
    half = [t.bfloat16() for t in (q, k, v)]                           # fla takes bf16/fp16 only
    got = chunk_summaries(*half, la, be, 0.125, 64, backend="fla")
    for a, b in zip(got, ref):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="flash-linear-attention needs CUDA")
def test_fla_inference_op_matches_the_training_call():
    """Without gradients the summaries go through the custom op mediagen::gdn_chunk_states_fla (opaque to
    torch.compile); with gradients fla is called directly. Both give the same summaries, and the op
    passes torch.library's checks (fake implementation, schema). (No backward here: fla 0.6 refuses its
    gated backward under triton < 3.7.1 on Hopper, the GPU image's triton 3.6.)"""
    pytest.importorskip("fla")
    from mediagen.text.kernels.hla.fla_backend import gdn_chunk_states_fla
    q, k, v, la, be = (t.cuda() for t in inputs(b=1, n=128, h=2, dk=32, dv=32))
    q, k, v, be = (t.bfloat16() for t in (q, k, v, be))
    la = la.float()
    with torch.no_grad():
        op = chunk_summaries(q, k, v, la, be, 0.125, 64, backend="fla")
    grad_inputs = [t.detach().requires_grad_() for t in (q, k, v, la, be)]
    direct = chunk_summaries(*grad_inputs, 0.125, 64, backend="fla")
    assert all(t.requires_grad for t in direct[:2]), "the gradient path must not go through the opaque op"
    for a, b in zip(op, direct):
        torch.testing.assert_close(a, b.detach(), rtol=0, atol=0)
    v_pad = F.pad(v, (0, 32))
    torch.library.opcheck(gdn_chunk_states_fla, (q, k, v_pad, la, be, 0.125, 64),
                          test_utils=("test_schema", "test_faketensor"))


def test_short_sequences_use_a_short_chunk_with_the_same_result():
    torch.manual_seed(0)
    m = HLAttention(16, 2, chunk=16, pool=2).double()
    x = torch.randn(1, 5, 16, dtype=F64)
    assert m.chunk_for(5) == 6 and m.chunk_for(40) == 16
    ones = torch.zeros(1, 2, 1, 16, 1, dtype=F64)                     # one chunk: no past gates
    torch.testing.assert_close(m(x), m(x, gates_override=ones), rtol=1e-10, atol=1e-10)


def test_one_chunk_is_gated_deltanet_without_the_router():
    """Up to one chunk of tokens there is no past chunk: the layer is plain GDN, whatever the router's
    weights, and its regularisers are 0."""
    torch.manual_seed(0)
    m = HLAttention(16, 2, chunk=16, pool=2).double()
    x = torch.randn(2, 11, 16, dtype=F64)
    torch.testing.assert_close(m(x), m.forward_gdn(x), rtol=1e-10, atol=1e-10)
    with torch.no_grad():
        m.route_q.mul_(50.0)
        m.pool_k.mul_(-3.0)
    torch.testing.assert_close(m(x), m.forward_gdn(x), rtol=1e-10, atol=1e-10)
    m(x, return_aux=True)
    assert set(m.aux_losses) == {"budget", "support", "binary", "total"} and m.aux_losses["total"].item() == 0.0


def test_chunk_routing_reads_only_its_top_k_chunks():
    """route='chunk': the k chosen chunks per query chunk with their per-token gates, others skipped;
    equal to the dense walk with every other gate set to 0."""
    from mediagen.text.kernels.hla.chunk import hla_chunked_indexed
    from mediagen.text.kernels.hla.router import chunk_routed_gates

    torch.manual_seed(0)
    m = HLAttention(16, 2, chunk=4, pool=2, top_k=2, route="chunk").double()
    x = torch.randn(2, 24, 16, dtype=F64)
    q, k, v, la, be = m.gdn_inputs(x)
    q_route = torch.einsum("bnhd,hde->bnhe", q, m.route_q)
    reps = bucket_representatives(k, m.pool_k, m.pool_v, m.pool_o, 4, 2)
    order, g_sel = chunk_routed_gates(q_route, reps, 4, m.gate_bias, 2)
    assert order.shape == (2, 2, 6, 2) and g_sel.shape == (2, 2, 6, 4, 2)
    assert bool((order[:, :, 0] == -1).all()) and bool((order[:, :, 1, 1] == -1).all())
    assert bool((order[:, :, 2:] >= 0).all()) and bool((order[..., 0] >= order[..., 1]).all())
    assert bool((g_sel >= 0).all()) and bool((g_sel <= 1).all())
    dense = torch.zeros(2, 2, 6, 4, 6, dtype=F64)                     # scatter the kept gates
    for c in range(6):
        for slot in range(2):
            j = order[:, :, c, slot]
            for b in range(2):
                for h in range(2):
                    if j[b, h] >= 0:
                        dense[b, h, c, :, j[b, h]] = g_sel[b, h, c, :, slot]
    ref = hla_chunked(q, k, v, la, be, dense, chunk=4)
    torch.testing.assert_close(hla_chunked_indexed(q, k, v, la, be, order, g_sel, chunk=4), ref,
                               rtol=1e-10, atol=1e-10)
    out = m(x)
    assert out.shape == (2, 24, 16) and torch.isfinite(out).all()


# ---- the short path (closed form up to two chunks) against the long path ----

def make_random(chunk=8, pool=2, dtype=torch.float32, seed=0, **kw):
    """An HLA layer with random router weights (identity at init would hide a transposed map) and
    decays strong enough that the chunks' maps differ from the identity."""
    torch.manual_seed(seed)
    m = HLAttention(16, 2, chunk=chunk, pool=pool, **kw).to(dtype)
    with torch.no_grad():
        for p in (m.route_q, m.pool_k, m.pool_v, m.pool_o):
            p.add_(torch.randn_like(p) * 0.5)
        m.A_log.copy_(torch.randn_like(m.A_log))
        m.out_norm.weight.uniform_(0.5, 1.5)
        m.out_proj.bias.normal_()
    return m


@pytest.mark.parametrize("n", [1, 5, 8, 9, 13, 16])
@pytest.mark.parametrize("batch,mask_kind", [(1, "none"), (3, "none"), (3, "right"), (3, "holes")])
def test_short_path_equals_long_path_forward_and_gradients(n, batch, mask_kind):
    """Chunk 8: lengths of one chunk and of two (the short path's limit, 16), below and above a
    threshold of 8 tokens (each path forced), fresh random inputs: the same outputs and the same
    gradients for the input and every parameter, the router's included, to fp32 rounding."""
    m = make_random(seed=n)
    m.short_max_tokens = 8
    seed = 100 * n + batch
    x = torch.randn(batch, n, 16, generator=torch.Generator().manual_seed(seed))
    mask = padding_mask(batch, n, mask_kind, seed)
    weight = torch.randn(batch, n, 16, generator=torch.Generator().manual_seed(seed + 1))
    results = short_and_long(m, x, mask, weight)
    (short, gx_s, gp_s), (long, gx_l, gp_l) = results
    assert long.abs().max() > 0.1
    assert_close_fp32(short, long, "output")
    assert_close_fp32(gx_s, gx_l, "input gradient")
    assert set(gp_s) == set(gp_l)                                    # the router trains from two chunks on
    assert ("route_q" in gp_l) == (n > 8)
    floor = 2e-5 * max(g.norm().item() for g in gp_l.values())       # exact zeros are rounding noise on both
    for name in gp_l:
        assert_close_fp32(gp_s[name], gp_l[name], f"gradient of {name}", floor=floor)


def test_short_path_reads_the_gates():
    """Two chunks: the second chunk's output depends on its gates (so the comparison above checks
    them): it differs from plain GDN, and matches the long path with the gates forced to 1 when the
    gate bias is huge."""
    m = make_random(dtype=F64)
    x = torch.randn(2, 14, 16, dtype=F64)
    short = m._forward_short(x)
    torch.testing.assert_close(short, m._forward_long(x), rtol=1e-10, atol=1e-10)
    assert not torch.allclose(short[:, 8:], m.forward_gdn(x)[:, 8:], atol=1e-3)
    torch.testing.assert_close(short[:, :8], m.forward_gdn(x)[:, :8], rtol=1e-10, atol=1e-10)
    m.gate_bias = 1e3
    torch.testing.assert_close(m._forward_short(x), m.forward_gdn(x), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("top_k,route", [(1, "token"), (2, "token"), (1, "chunk")])
def test_short_path_with_chunk_skipping_options(top_k, route):
    """With one past chunk at most, top_k >= 1 keeps it whatever the routing: the short path serves."""
    m = make_random(dtype=F64, top_k=top_k, route=route)
    x = torch.randn(2, 13, 16, dtype=F64)
    assert m.takes_short_path(13)
    torch.testing.assert_close(m._forward_short(x), m._forward_long(x), rtol=1e-10, atol=1e-10)


def test_short_path_dispatch(monkeypatch):
    """forward takes the short path up to short_max_tokens (default two chunks), else the long one,
    and the long one where it does what the short one does not."""
    m = make_random(dtype=F64).eval()                                # training mode asks for regularisers
    assert m.short_max_tokens == 16 and HLAttention(16, 2).short_max_tokens == 512
    calls = []
    monkeypatch.setattr(m, "_forward_short", lambda *a, **k: calls.append("short"))
    monkeypatch.setattr(m, "_forward_long", lambda *a, **k: calls.append("long"))
    for n in (1, 8, 16, 17, 40):
        m(torch.randn(1, n, 16, dtype=F64))
    assert calls == ["short", "short", "short", "long", "long"]
    calls.clear()
    m(torch.randn(1, 12, 16, dtype=F64), return_aux=True)           # two chunks' regularisers
    m(torch.randn(1, 6, 16, dtype=F64), return_aux=True)            # one chunk: they are 0
    m(torch.randn(1, 12, 16, dtype=F64), gates_override=torch.ones(1, 2, 2, 8, 2, dtype=F64))
    m.gate_threshold = 0.5
    m(torch.randn(1, 12, 16, dtype=F64))
    m(torch.randn(1, 6, 16, dtype=F64))
    m.gate_threshold, m.short_max_tokens = None, 0
    m(torch.randn(1, 3, 16, dtype=F64))
    assert calls == ["long", "short", "long", "long", "short", "long"]
    for bad in (-1, 17):
        with pytest.raises(ValueError, match=f"short_max_tokens={bad} is not allowed"):
            HLAttention(16, 2, chunk=8, pool=2, short_max_tokens=bad)


def test_short_path_regularisers_and_cached_weights():
    """One chunk in training mode: regularisers of 0, as the long path; the folded weights are cached
    for inference and follow an in-place change of a parameter."""
    m = make_random(dtype=F64).train()
    x = torch.randn(2, 7, 16, dtype=F64)
    out = m(x)
    assert m.aux_losses["total"].item() == 0.0 and out.requires_grad
    m.eval()
    y = torch.randn(2, 12, 16, dtype=F64)
    with torch.no_grad():
        before = m(y)
        m.pool_o.mul_(-2.0)
        m.dt_bias.add_(1.0)
        after = m(y)
        assert not torch.allclose(before, after)
        torch.testing.assert_close(after, m._forward_long(y), rtol=1e-10, atol=1e-10)


def test_short_path_in_bfloat16():
    """A bf16 layer computes between its projections in fp32 (the triangular solve needs it) and
    agrees with the long path to bf16 rounding, at one chunk and at two."""
    m = make_random(dtype=torch.bfloat16).eval()
    for n in (6, 14):
        x = torch.randn(2, n, 16).bfloat16()
        mask = torch.ones(2, n, dtype=torch.long)
        mask[1, n // 2:] = 0
        with torch.no_grad():
            short, long = m._forward_short(x, mask), m._forward_long(x, mask)
        assert short.dtype == torch.bfloat16
        assert_close_fp32(short, long, f"bf16 output at {n} tokens", tol=2e-2)

"""The fused CPE kernel (``mediagen.kernels.cpe``) against its conv reference, and its use by the processors."""

import random

import pytest
import torch

import mediagen
from mediagen.kernels.cpe import cpe_add, cpe_add_reference
from mediagen.kernels.mhla import autograd as op_autograd, tiles as op_tiles
from mediagen.models import processors
from models_fixtures import dit_inputs, tiny_dit

ON_GPU = torch.cuda.is_available()


def shifted_sum(o, v, weight, bias, grid):
    """The definition, token by token in float64: out[t] = o[t] + b + sum over taps of w[tap] v[t + offset]."""
    B, N, C = v.shape
    g = (1,) * (3 - len(grid)) + tuple(grid)
    k = (1,) * (3 - len(grid)) + tuple(weight.shape[2:])
    x = v.double().reshape(B, *g, C)
    w = weight.double().reshape(C, *k)
    out = o.double().reshape(B, *g, C) + (0 if bias is None else bias.double())
    for i in range(k[0]):
        for j in range(k[1]):
            for m in range(k[2]):
                d = (i - k[0] // 2, j - k[1] // 2, m - k[2] // 2)
                src = [slice(max(s, 0), L + min(s, 0)) for s, L in zip(d, g)]
                dst = [slice(max(-s, 0), L + min(-s, 0)) for s, L in zip(d, g)]
                out[(slice(None), *dst)] += x[(slice(None), *src)] * w[:, i, j, m]
    return out.reshape(B, N, C)


CASES = [  # grid, kernel, C, strided v, bias
    ((37,), (3,), 20, False, True),
    ((14, 14), (3, 3), 192, False, True),
    ((5, 7), (5, 3), 33, True, True),
    ((3, 4, 6), (3, 1, 1), 48, True, True),
    ((2, 5, 3), (3, 3, 3), 130, False, False),
    ((3, 2, 9), (7, 1, 5), 16, False, True),  # kernels longer than their axes
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("grid,kernel,C,strided,has_bias", CASES)
def test_cpe_add_matches_the_conv_and_the_definition(device, grid, kernel, C, strided, has_bias, dtype):
    gen = torch.Generator().manual_seed(random.randrange(2**31))
    B, N = 2, int(torch.tensor(grid).prod())
    o = torch.randn(B, N, C, generator=gen).to(device, dtype)
    # strided: v is one third of a fused qkv projection, rows 3C apart (the video models' layout)
    v = torch.randn(B, N, 3 * C if strided else C, generator=gen).to(device, dtype)
    v = v[..., C:2 * C] if strided else v
    weight = torch.randn(C, 1, *kernel, generator=gen).to(device, dtype)
    bias = torch.randn(C, generator=gen).to(device, dtype) if has_bias else None
    got = cpe_add(o, v, weight, bias, grid)
    want = shifted_sum(o, v, weight, bias, grid)
    ref = cpe_add_reference(o, v, weight, bias, grid)
    assert got.dtype == ref.dtype == dtype and got.shape == (B, N, C)
    scale = want.abs().max().item()
    tol = 1e-5 if dtype == torch.float32 else 1e-2  # bf16: one rounding of the output
    assert (got.double() - want).abs().max().item() < tol * scale
    assert (ref.double() - want).abs().max().item() < tol * scale


@pytest.mark.parametrize("bad, words", [
    (dict(grid=(5, 5)), "product is the token count"),
    (dict(kernel=(2, 3)), "one odd size per grid axis"),
    (dict(kernel=(3,)), "one odd size per grid axis"),
    (dict(bias=torch.zeros(5)), "bias has shape (5,)"),
])
def test_cpe_add_refuses_bad_arguments(bad, words):
    grid, kernel = bad.get("grid", (4, 6)), bad.get("kernel", (3, 3))
    o = v = torch.zeros(1, 24, 8)
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        cpe_add_reference(o, v, torch.zeros(8, 1, *kernel), bad.get("bias", torch.zeros(8)), grid)


def test_cpe_triton_op_schema(device):
    o, v = torch.randn(2, 24, 16, device=device), torch.randn(2, 24, 16, device=device)
    weight, bias = torch.randn(16, 1, 3, 3, device=device), torch.randn(16, device=device)
    # (the fake implementation runs on a GPU: Triton's CPU interpreter launches a kernel even on fake tensors)
    checks = ("test_schema", "test_faketensor") if o.is_cuda else ("test_schema",)
    torch.library.opcheck(torch.ops.mediagen.cpe_add.default, (o, v, weight, bias, [4, 6]), test_utils=checks)
    got = torch.ops.mediagen.cpe_add(o, v, weight, bias, [4, 6])
    torch.testing.assert_close(got, cpe_add_reference(o, v, weight, bias, (4, 6)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["blocked", "triton"])
def test_sampling_takes_the_fused_cpe_and_training_the_conv(device, monkeypatch, backend):
    """A DiT layer with a 3x3 CPE: without gradients (sampling) o + CPE(v) is made in one launch, by the MHLA op's
    dense forward on the Triton path and by the CPE kernel after the op elsewhere; with gradients by the conv
    and autograd; all give the same output."""
    monkeypatch.setenv("MEDIAGEN_MHLA_BACKEND", backend)
    monkeypatch.setattr(processors, "fused_cpe_device", lambda t: True)
    monkeypatch.setattr(op_tiles, "choose_algorithm", lambda *a, **kw: "dense")
    launched, dense = [], []
    monkeypatch.setattr(processors, "cpe_add", lambda *a: launched.append(1) or cpe_add(*a))
    run_dense = op_autograd._run_dense  # (the op's plans launch it)
    monkeypatch.setattr(op_autograd, "_run_dense",
                        lambda launch, *a: dense.append(tuple(launch.consts[c] for c in ("CK0", "CK1", "CK2")))
                        or run_dense(launch, *a))
    model = mediagen.convert(tiny_dit(), "mhla", blocks=[2, 2], cpe_kernel=3).to(device)
    for proc in (blk.attn1.processor for blk in model.transformer_blocks):
        with torch.no_grad():
            proc.cpe.weight.normal_()
            proc.cpe.bias.normal_()
    inputs = {k: t.to(device) for k, t in dit_inputs().items()}
    trained = model(**inputs, return_dict=False)[0]
    assert not launched and set(dense) <= {(0, 1, 1)}  # (no taps: no CPE)
    dense.clear()
    with torch.no_grad():
        sampled = model(**inputs, return_dict=False)[0]
    layers = len(model.transformer_blocks)
    if backend == "triton":  # the kernel's taps over the grid's three axes
        assert (launched, dense) == ([], [(1, 3, 3)] * layers)
    else:
        assert (len(launched), dense) == (layers, [])
    torch.testing.assert_close(sampled, trained.detach(), rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not ON_GPU, reason="Inductor's Triton code runs on a GPU")
def test_compiled_sampling_launches_the_cpe_kernel_from_inductor():
    """Traced without gradients, Inductor's code launches the CPE kernel and the MHLA dense kernel itself (no
    conv for the CPE, no custom-op call) and the compiled model matches eager."""
    from torch._inductor.utils import run_and_get_code

    inputs = {k: t.cuda() for k, t in dit_inputs().items()}

    def compiled(model):
        torch._dynamo.reset()
        with torch.no_grad():
            want = model(**inputs, return_dict=False)[0]
            got, code = run_and_get_code(torch.compile(model), **inputs, return_dict=False)
        return got[0], want, "\n".join(code)

    model = mediagen.convert(tiny_dit(), "mhla", blocks=[2, 2], cpe_kernel=3).cuda()
    for proc in (blk.attn1.processor for blk in model.transformer_blocks):
        with torch.no_grad():
            proc.cpe.weight.normal_()
            proc.cpe.bias.normal_()
    got, want, code = compiled(model)
    plain = compiled(mediagen.convert(tiny_dit(), "mhla", blocks=[2, 2]).cuda())[2]
    assert "cpe_add_kernel" in code and "mediagen.mhla_fwd" not in code
    # the patch embedding's conv is the only one, as in the same model without a CPE
    assert code.count("convolution") == plain.count("convolution")
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)

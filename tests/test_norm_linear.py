"""models.norm_linear: an RMSNorm and the linear layer after it as one autograd function, which saves the norm's
input and per-row rstd and recomputes the norm's output in backward; the MHLA processors run their output norm
and ``to_out[0]`` through it in training. Same outputs and gradients as the two ops apart (on a CPU, where the
function runs the composite RMSNorm op for op, bit for bit), fewer bytes saved for backward, and it traces
under torch.compile."""

import pytest
import torch
import torch.nn.functional as F
from benchmarks.saved_activations import saved_bytes
from models_fixtures import dit_inputs, tiny_dit, tiny_wan, wan_inputs
from torch import nn

import mediagen
import mediagen.models.processors as processors
from mediagen.models import norm_linear
from mediagen.models.norm_linear import rms_norm_linear
from mediagen.models.norms import cast_rms_norms

BF16 = dict(rtol=1.6e-2, atol=1e-2)    # a bf16 rounding step
FP32 = dict(rtol=1e-6, atol=1e-6)


def _reference(x, norm_weight, eps, weight, bias, flatten_heads, dtype):
    """The processor's unfused code: RMSNorm, flatten the heads, ``type_as(q)``, the linear."""
    y = F.rms_norm(x, (x.shape[-1],), norm_weight, eps)
    if flatten_heads:
        y = y.flatten(-2)
    return F.linear(y.to(dtype), weight, bias)


def _fused(x, norm_weight, eps, weight, bias, flatten_heads, dtype):
    return rms_norm_linear(x, norm_weight, eps, weight, bias, flatten_heads=flatten_heads, linear_input_dtype=dtype)


# per head: x (B, N, H, D) with a (D,) weight; all heads: x (B, N, C) with a (C,) weight
SHAPES = [(2, 33, 3, 16), (1, 40, 4, 32), (2, 33, 48), (3, 17, 64)]
# (autocast, dtype of x, dtype the norm weight is used in): fp32; bf16 autocast with the norm weight cast to the
# input's dtype (CastRMSNorm, the training components), with the fp32 weight (nn.RMSNorm as built), and an fp32 x
MODES = {"fp32": (False, torch.float32, torch.float32), "bf16-cast-norm": (True, torch.bfloat16, torch.bfloat16),
         "bf16-fp32-norm": (True, torch.bfloat16, torch.float32), "bf16-fp32-x": (True, torch.float32, torch.float32)}


def _outputs_and_grads(fn, device, shape, bias, mode, seed):
    autocast, x_dtype, norm_dtype = MODES[mode]
    flatten = len(shape) == 4
    g = torch.Generator().manual_seed(seed)
    c_in, c_out = shape[-1] * (shape[-2] if flatten else 1), 40
    x = torch.randn(shape, generator=g).to(device, x_dtype).requires_grad_()
    norm_weight = (1 + 0.2 * torch.randn(shape[-1], generator=g)).to(device).requires_grad_()
    weight = (torch.randn(c_out, c_in, generator=g) / c_in ** 0.5).to(device).requires_grad_()
    b = torch.randn(c_out, generator=g).to(device).requires_grad_() if bias else None
    grad = torch.randn(*shape[:-2 if flatten else -1], c_out, generator=g).to(device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        out = fn(x, norm_weight.to(norm_dtype), 1e-6, weight, b, flatten, x_dtype)   # (q's dtype is x's here)
    inputs = [x, norm_weight, weight] + ([b] if bias else [])
    return [out] + list(torch.autograd.grad(out, inputs, grad.to(out.dtype)))


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")  # (bf16-fp32-norm: torch's composite)
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", SHAPES)
def test_function_matches_the_unfused_ops(device, shape, bias, mode):
    seed = SHAPES.index(shape) * 10 + bias * 5 + list(MODES).index(mode)
    ref = _outputs_and_grads(_reference, device, shape, bias, mode, seed)
    got = _outputs_and_grads(_fused, device, shape, bias, mode, seed)
    assert [t.dtype for t in got] == [t.dtype for t in ref]
    tol = FP32 if mode == "fp32" else BF16
    for name, a, b in zip(["out", "x", "norm weight", "W", "b"], got, ref):
        torch.testing.assert_close(a, b, **tol, msg=lambda m, name=name: f"{name}: {m}")
        if device.type == "cpu":   # the composite RMSNorm op for op, the linear's own products
            assert torch.equal(a, b), name


@pytest.mark.parametrize("mode", ["fp32", "bf16-cast-norm"])
@pytest.mark.parametrize("shape", [SHAPES[0], SHAPES[2]])
def test_fused_kernel_branch_passes_its_arguments_right(monkeypatch, shape, mode):
    """The branch a CUDA device takes (torch's fused RMSNorm kernels), run on a CPU: the forward kernel exists
    there, its backward is torch's own decomposition of the CUDA kernel."""
    from torch._decomp import decompositions

    def backward(grad_y, x, rstd, weight, mask):
        return decompositions._fused_rms_norm_backward(grad_y, x, [x.shape[-1]], rstd, weight, mask)

    ref = _outputs_and_grads(_reference, torch.device("cpu"), shape, True, mode, 7)
    monkeypatch.setattr(norm_linear, "_uses_fused_kernel", lambda x, weight: weight.dtype == x.dtype)
    monkeypatch.setattr(norm_linear, "_fused_rms_norm_backward", backward)
    got = _outputs_and_grads(_fused, torch.device("cpu"), shape, True, mode, 7)
    tol = dict(rtol=1e-5, atol=1e-5) if mode == "fp32" else BF16
    for a, b in zip(got, ref):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, **tol)


# --- the processors ---------------------------------------------------------------------------------------------

def _converted(family, out_norm, **options):
    if family == "wan":
        model = mediagen.convert(tiny_wan(num_layers=2), "mhla", blocks=[1, 2, 2], rope="features",
                                 out_norm=out_norm, grid=(3, 4, 6), **options)
    else:
        model = mediagen.convert(tiny_dit(num_layers=2), "mhla", out_norm=out_norm, **options)
    with torch.no_grad():  # processor weights off their init (the norm weight is all ones there)
        for name, p in model.named_parameters():
            if ".processor." in name:
                p.add_(torch.rand_like(p) * 0.1)
    return model.train()


def _attn_layers(model):
    return [b.attn1 for b in (model.blocks if hasattr(model, "blocks") else model.transformer_blocks)]


def _set_fused(model, on):
    for attn in _attn_layers(model):
        attn.processor.fuse_out_norm_linear = on


@pytest.fixture
def fused_calls(monkeypatch):
    calls = []

    def spy(*args, **kwargs):
        calls.append(args[0].shape)
        return rms_norm_linear(*args, **kwargs)

    monkeypatch.setattr(processors, "rms_norm_linear", spy)
    return calls


def _step(model, inputs, autocast):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)  # (DiT's class embedding drops labels at random in training mode)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = model(**inputs, return_dict=False)[0]
    out.float().square().mean().backward()
    params = getattr(model, "_orig_mod", model).named_parameters()  # (a compiled model's own names)
    return out.detach(), {n: p.grad for n, p in params if p.grad is not None}


@pytest.mark.parametrize("family,out_norm,autocast", [("wan", "per_head", False), ("wan", "per_head", True),
                                                      ("wan", True, False), ("wan", True, True),
                                                      ("dit", True, False)])
def test_processor_training_step_is_unchanged(family, out_norm, autocast, fused_calls):
    model = _converted(family, out_norm)
    if autocast:
        cast_rms_norms(model)  # as the training components do (the out norms become CastRMSNorm too)
        assert all(type(a.processor.out_norm).__name__ == "CastRMSNorm" for a in _attn_layers(model))
    inputs = wan_inputs() if family == "wan" else dit_inputs()
    _set_fused(model, False)
    ref_out, ref_grads = _step(model, inputs, autocast)
    assert not fused_calls
    _set_fused(model, True)
    out, grads = _step(model, inputs, autocast)
    assert len(fused_calls) == len(_attn_layers(model))  # every MHLA layer took the fused path
    assert torch.equal(out, ref_out)
    assert grads.keys() == ref_grads.keys() and any(".out_norm." in n for n in grads)
    for name in ref_grads:  # the same ops on a CPU: equal, not just close
        assert torch.equal(grads[name], ref_grads[name]), name


def test_sampling_and_non_plain_layers_keep_the_unfused_code(fused_calls):
    model = _converted("wan", "per_head")
    inputs = wan_inputs()
    with torch.no_grad():  # sampling: nothing is saved for backward
        model(**inputs)
    model.requires_grad_(False)  # gradients on, but nothing to differentiate
    model(**inputs)
    assert not fused_calls
    model.requires_grad_(True)

    attn = _attn_layers(model)[0]
    seen = []
    handle = attn.to_out[0].register_forward_hook(lambda *a: seen.append(1))  # a hook must still run
    _step(model, inputs, False)
    assert seen and len(fused_calls) == 1  # only the other layer fused
    handle.remove()

    class Wrapped(nn.Linear):  # a LoRA / PEFT-like wrapper computes something else: kept as it is
        pass

    fused_calls.clear()
    plain = attn.to_out[0]
    attn.to_out[0] = Wrapped(plain.in_features, plain.out_features)
    _step(model, inputs, False)
    assert len(fused_calls) == 1
    attn.to_out[0] = plain

    # a gate or a CPE between the norm and the projection: the modules apart
    fused_calls.clear()
    _step(_converted("wan", "per_head", out_gate=True), inputs, False)
    _step(_converted("wan", True, cpe_kernel=3), inputs, False)
    assert not fused_calls


# --- bytes saved for backward -----------------------------------------------------------------------------------

@pytest.mark.parametrize("out_norm,autocast", [("per_head", False), (True, True)])
def test_fused_layer_saves_at_least_one_activation_less(out_norm, autocast):
    torch.manual_seed(0)
    model = mediagen.convert(tiny_wan(num_layers=1, num_attention_heads=4, attention_head_dim=32), "mhla",
                             blocks=[1, 2, 2], rope="features", out_norm=out_norm).train()
    if autocast:
        cast_rms_norms(model)
    inputs = wan_inputs(batch=2, frames=4, height=32, width=32)  # 4 x 16 x 16 = 1,024 tokens of 128 channels
    attn = model.blocks[0].attn1
    before = saved_bytes(model, attn, inputs, autocast)
    attn.processor.fuse_out_norm_linear = False
    apart = saved_bytes(model, attn, inputs, autocast)
    one_activation = 2 * 1024 * 128 * (2 if autocast else 4)  # (B, N, C) in the linear's dtype
    print(f"saved by one attention layer: {apart} bytes apart, {before} fused")
    assert apart - before >= one_activation


# --- torch.compile ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend,autocast", [("aot_eager", False), ("aot_eager", True), ("inductor", False)])
def test_compiled_training_step_matches_eager(backend, autocast, fused_calls):
    """Dynamo traces the function (fullgraph: no graph break) and AOTAutograd its backward; inductor on the CPU
    takes about 20 s for this one-layer model."""
    torch._dynamo.reset()
    model = _converted("wan", "per_head")
    if backend == "inductor":
        model.blocks = model.blocks[:1]
    if autocast:
        cast_rms_norms(model)
    inputs = wan_inputs()
    ref_out, ref_grads = _step(model, inputs, autocast)
    fused_calls.clear()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    out, grads = _step(compiled, inputs, autocast)
    torch._dynamo.reset()
    assert fused_calls  # traced through the fused path
    tol = BF16 if autocast else dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out, ref_out, **tol)
    assert grads.keys() == ref_grads.keys()
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], **tol, msg=lambda m, n=name: f"{n}: {m}")


def _graph_saved_bytes(out, exclude) -> int:
    """Bytes of the distinct storages (parameters' excluded) that the autograd graph behind ``out`` holds for
    backward: every node's saved tensors, a compiled graph's (AOTAutograd's CompiledFunctionBackward) included."""
    seen, storages, nodes = set(), {}, [out.grad_fn]
    while nodes:
        fn = nodes.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        for t in getattr(fn, "saved_tensors", ()) or ():
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in exclude:
                storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        nodes.extend(f for f, _ in fn.next_functions)
    return sum(storages.values())


@pytest.mark.parametrize("out_norm", ["per_head", True])
def test_compiled_fused_layer_saves_one_activation_less(out_norm):
    """Traced, the function's own save list does not bind: AOTAutograd's min-cut partitioner (Inductor's, and
    aot_eager_decomp_partition's, used here for speed) chooses what the joint graph keeps, and left alone it keeps
    the norm's output for the linear's weight gradient. The norm inside a checkpoint makes it recompute it, so
    the compiled layer, like the eager one, keeps the norm's bf16 (B, N, C) output less than the modules apart."""
    saved = {}
    for fused in (False, True):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = mediagen.convert(tiny_wan(num_layers=1, num_attention_heads=4, attention_head_dim=32), "mhla",
                                 blocks=[1, 2, 2], rope="features", out_norm=out_norm).train()
        cast_rms_norms(model)
        _set_fused(model, fused)
        compiled = torch.compile(model, backend="aot_eager_decomp_partition", fullgraph=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = compiled(**wan_inputs(batch=2, frames=4, height=32, width=32), return_dict=False)[0]
        saved[fused] = _graph_saved_bytes(out, {p.untyped_storage().data_ptr() for p in model.parameters()})
    torch._dynamo.reset()
    one_activation = 2 * 1024 * 128 * 2  # 2 x (4 x 16 x 16) tokens of 128 channels, bf16
    assert saved[False] - saved[True] >= one_activation, saved


def test_saved_activations_benchmark_reports_less_saved_fused(capsys):
    """``python -m benchmarks saved_activations --tiny``: one Wan-layout block, both norm forms; fused saves the norm's
    bf16 (B, N, C) output less, less the fp32 rstd per row it keeps (a row per token and head with per_head; on a
    GPU torch's fused norm saves its own rstd apart too, so the saving is that close to one activation), and the
    printed line says so (in KiB: the tiny block's saving is a few KiB)."""
    from benchmarks import saved_activations
    rows = saved_activations.main(["--tiny"])
    lines = [line for line in capsys.readouterr().out.splitlines() if "saved per block" in line]
    assert len(rows) == len(lines) == 2
    one_activation = 48 * 32 * 2   # 3x4x4 tokens, 2 heads of 16, bf16
    rstd = 48 * 2 * 4              # fp32, one per token and head
    for row, line in zip(rows, lines):   # "... 3.0 KiB less; at 75600 tokens ...: 335 -> 317 MiB, 18 MiB less"
        less = row["apart"] - row["fused"]
        assert less >= one_activation - rstd, (row, line)
        assert float(line.split(" KiB less;")[0].split()[-1]) == round(less / 1024, 1), line


def test_saved_activations_benchmark_measures_the_softmax_block_beside(capsys):
    """``--sdpa`` adds the same block with its softmax attention on the same inputs: a third row and line. The two
    blocks share everything but the attention core (norms, projections, feed-forward, modulation), so each keeps
    most of what the other keeps; a measure that missed the block's forward (no bytes) or counted the weights
    (megabytes more) would fall outside that."""
    from benchmarks import saved_activations
    rows = saved_activations.main(["--tiny", "--sdpa"])
    out = capsys.readouterr().out
    assert [row["out_norm"] for row in rows] == ["per_head", "all heads", "softmax"][: len(rows)] and len(rows) == 3
    softmax, mhla = rows[2]["saved"], rows[0]["apart"]
    assert 0.5 * mhla < softmax < 2 * mhla, (softmax, mhla)
    line = next(line for line in out.splitlines() if line.strip().startswith("softmax:"))
    assert f"{softmax / 2 ** 20:.1f} MiB" in line, line


def test_saved_activations_benchmark_layers_and_compile_arguments(capsys):
    """``--layers N`` builds N blocks and still reports the first block's saved bytes (those of a one-block
    model); ``--compile`` measures a step peak, so it needs ``--peak``; a block count below 1 is refused."""
    from benchmarks import saved_activations
    one = saved_activations.main(["--tiny"])
    two = saved_activations.main(["--tiny", "--layers", "2"])
    assert [(r["apart"], r["fused"]) for r in two] == [(r["apart"], r["fused"]) for r in one]
    for argv, message in ((["--tiny", "--compile"], "give --peak too"), (["--tiny", "--layers", "0"], "--layers 0")):
        with pytest.raises(SystemExit):
            saved_activations.main(argv)
        assert message in capsys.readouterr().err

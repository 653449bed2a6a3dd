"""A compiled training step (train.compile) computes the gradients the eager one does.

Inductor's mix-order reduction gives the slices of a chunked parameter's gradient (Wan's scale_shift_table)
stale memory on GPUs (trainer.training_compile_options): the trainer compiles with it off. The CPU test
checks that the trainer passes the options and that Inductor knows them; the GPU test compares compiled and
eager gradients of one block of Wan2.1-1.3B and of the shipped video models' preset, at sizes where Inductor fuses
that way (>= 5M elements, >= 4096 rows).

train.compile_scope='blocks' compiles each repeated block on its own: on the CPU its gradients under gradient
checkpointing match eager; on a GPU an MHLA model of Wan2.1-1.3B's width at 480p, compiled so, must hold no more
than eager does (the whole model compiled as one graph holds ~1.9 GiB more a layer there: docs/RESULTS.md)."""

import pytest
import torch

from mediagen.training import train
from mediagen.training.config import ConfigError
from mediagen.training.trainer import compile_for_training, training_compile_options
from training_helpers import TINY_DIT, TINY_WAN, tiny_config


def test_trainer_compiles_with_mix_order_reduction_off(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, *a, **kw: calls.append((type(self).__name__, kw)))
    cfg = tiny_config(tmp_path / "run", TINY_WAN, "train.compile=true", "train.max_steps=1", "checkpoint.every=1",
                      "checkpoint.save_pipeline=false", "data.num_workers=0")
    train(cfg)
    assert calls == [("WanTransformer3DModel", {"options": {"triton.mix_order_reduction": False}})]
    known = torch._inductor.config.get_config_copy()
    assert all(key in known for key in training_compile_options())  # torch.compile refuses unknown options


def test_trainer_compiles_each_block_with_scope_blocks(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, *a, **kw: calls.append((type(self).__name__, kw)))
    cfg = tiny_config(tmp_path / "run", TINY_WAN, "train.compile=true", "train.compile_scope=blocks",
                      "train.max_steps=1", "checkpoint.every=1", "checkpoint.save_pipeline=false",
                      "data.num_workers=0")
    train(cfg)
    options = {"options": training_compile_options() or None}
    assert calls == [("WanTransformerBlock", options)] * 2  # wan-tiny's two blocks, the model itself not


def test_compile_scope_refusals(tmp_path):
    with pytest.raises(ConfigError, match=r"train.compile_scope='layers' is not allowed.*'model', 'blocks'"):
        tiny_config(tmp_path / "a", TINY_WAN, "train.compile=true", "train.compile_scope=layers")
    cfg = tiny_config(tmp_path / "b", TINY_DIT, "train.compile=true", "train.compile_scope=blocks",
                      "train.max_steps=1", "data.num_workers=0")
    with pytest.raises(ConfigError, match=r"train.compile_scope='blocks' is not allowed for DiTTransformer2DModel"):
        train(cfg)
    assert not (tmp_path / "b" / "checkpoints").exists()


def _wan_grads(model):
    from mediagen.models.presets import preset

    cfg = preset("wan-tiny")["config"]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, cfg["in_channels"], 4, 8, 8, generator=g)
    text = torch.randn(2, 8, cfg["text_dim"], generator=g)
    model.zero_grad(set_to_none=True)
    out = model(hidden_states=x, timestep=torch.tensor([300.0, 800.0]), encoder_hidden_states=text, return_dict=False)[0]
    out.square().mean().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("attention", ["mhla", None])
def test_block_compiled_gradients_match_eager_under_checkpointing(attention):
    """Each block compiled on its own, called through gradient checkpointing (recomputed in the backward): the
    same gradients as the eager model, every parameter's."""
    import mediagen
    from mediagen.models.presets import build_transformer

    torch.manual_seed(0)
    model = build_transformer("wan-tiny").train()
    if attention:
        mediagen.convert(model, attention, rope="features", out_norm=True, grid=(4, 4, 4), blocks=(2, 2, 2))
    model.enable_gradient_checkpointing()
    eager = _wan_grads(model)
    torch._dynamo.reset()
    compile_for_training(model, "blocks")
    try:
        compiled = _wan_grads(model)
        assert all(b._compiled_call_impl is not None for b in model.blocks)
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # the blocks ran compiled
    finally:
        torch._dynamo.reset()
    assert compiled.keys() == eager.keys() and len(eager) > 10
    for name, g in eager.items():
        err = ((compiled[name] - g).norm() / g.norm().clamp_min(1e-12)).item()
        assert err < 1e-4, f"{name}: block-compiled gradient {err:.2e} from eager (relative)"


# (preset, latents, text width): Wan2.1-1.3B, 2 x 64 x 64 = 8,192 tokens of width 1,536; the shipped video models'
# preset at its training size, 32 clips of 16 x 8 x 8 = 32,768 rows of width 384
SIZES = {"wan2.1-1.3b": ((1, 16, 2, 128, 128), 4096), "wan-mmnist": ((32, 1, 16, 64, 64), 384)}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="mix-order reduction is an Inductor GPU fusion")
@pytest.mark.parametrize("name", sorted(SIZES))
def test_compiled_wan_gradients_match_eager(name):
    from mediagen.models.presets import build_transformer

    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    model = build_transformer(name, num_layers=1).cuda().train()
    shape, text_dim = SIZES[name]
    x = torch.randn(*shape, device="cuda")
    t = torch.full((shape[0],), 700.0, device="cuda")
    text = torch.randn(shape[0], 64, text_dim, device="cuda")
    target = torch.randn_like(x)

    def grads(fn):
        model.zero_grad(set_to_none=True)
        out = fn(hidden_states=x, timestep=t, encoder_hidden_states=text, return_dict=False)[0]
        torch.nn.functional.mse_loss(out, target).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    eager = grads(model)
    torch._dynamo.reset()
    compiled = grads(torch.compile(model, options=training_compile_options() or None))
    torch._dynamo.reset()
    largest = max(g.norm() for g in eager.values())
    for param, g in eager.items():
        # a key bias's gradient is zero but for rounding (softmax ignores a shift shared by all keys)
        if g.norm() > 1e-3 * largest and not param.endswith("to_k.bias"):
            err = ((compiled[param] - g).norm() / g.norm()).item()
            assert err < 1e-2, f"{name} {param}: compiled gradient {err:.2e} from eager (relative)"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the peak of a 1.3B-wide step needs a GPU")
def test_block_compiled_mhla_step_holds_no_more_than_eager():
    """4 checkpointed MHLA blocks of Wan2.1-1.3B's width at 480p (32,760 tokens, blocks 3 x 5 x 10), bf16 autocast:
    a step's peak compiled by blocks is within 5% (+128 MiB) of the eager step's."""
    import functools

    import mediagen
    from benchmarks.saved_activations import step_peak
    from mediagen.models.norms import cast_rms_norms
    from mediagen.models.presets import build_transformer, preset

    torch.manual_seed(0)
    model = build_transformer("wan2.1-1.3b", num_layers=4)
    mediagen.convert(model, "mhla", rope="features", out_norm=True, grid=(21, 30, 52), blocks=(3, 5, 10))
    cast_rms_norms(model)
    model = model.cuda().train()
    model.enable_gradient_checkpointing()
    cfg = preset("wan2.1-1.3b")["config"]
    inputs = dict(hidden_states=torch.randn(1, cfg["in_channels"], 21, 60, 104, device="cuda"),
                  timestep=torch.tensor([500.0], device="cuda"),
                  encoder_hidden_states=torch.randn(1, 512, cfg["text_dim"], device="cuda"))

    peak = functools.partial(step_peak, model, inputs, True)  # bf16 autocast, as training runs
    peak()  # warm-up: kernels compiled, allocator settled
    eager = peak()
    torch._dynamo.reset()
    compile_for_training(model, "blocks")
    try:
        peak()
        compiled = peak()
    finally:
        torch._dynamo.reset()
    mib = 2 ** 20
    assert compiled <= 1.05 * eager + 128 * mib, f"compiled by blocks {compiled / mib:.0f} MiB, eager {eager / mib:.0f}"

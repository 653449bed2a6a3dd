"""A compiled training step (train.compile) computes the gradients the eager one does.

Inductor's mix-order reduction gives the slices of a chunked parameter's gradient (Wan's scale_shift_table)
stale memory on GPUs (trainer.training_compile_options): the trainer compiles with it off. The CPU test
checks that the trainer passes the options and that Inductor knows them; the GPU test compares compiled and
eager gradients of one block of Wan2.1-1.3B and of the shipped video models' preset, at sizes where Inductor fuses
that way (>= 5M elements, >= 4096 rows)."""

import pytest
import torch

from mediagen.training import train
from mediagen.training.trainer import training_compile_options
from training_helpers import TINY_WAN, tiny_config


def test_trainer_compiles_with_mix_order_reduction_off(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, *a, **kw: calls.append((type(self).__name__, kw)))
    cfg = tiny_config(tmp_path / "run", TINY_WAN, "train.compile=true", "train.max_steps=1", "checkpoint.every=1",
                      "checkpoint.save_pipeline=false", "data.num_workers=0")
    train(cfg)
    assert calls == [("WanTransformer3DModel", {"options": {"triton.mix_order_reduction": False}})]
    known = torch._inductor.config.get_config_copy()
    assert all(key in known for key in training_compile_options())  # torch.compile refuses unknown options


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

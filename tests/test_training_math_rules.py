"""The arithmetic of LoRA, the learning-rate schedule and the training objectives, each checked against an
independent computation of its rule on tiny inputs: LoRA starts as the base model, trains only the adapters of
the target projections and fuses W + (alpha / r) B A; the optimizer takes the config's hyper-parameters and the
cosine schedule holds its floor; flow sigmas follow the logit-normal / uniform draw and the shift; DDPM noises
with DiT's linear-beta alpha-bar at every timestep 0..T-1."""

import math
from types import SimpleNamespace

import pytest
import torch

from mediagen.training.lora import add_lora, fuse_lora_, lora_state_dict, save_lora
from mediagen.training.objectives import Objective
from mediagen.training.schedule import lr_factor, make_optimizer

TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]


# --- LoRA ------------------------------------------------------------------------------------------

class _Attn(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.to_q, self.to_k, self.to_v = (torch.nn.Linear(d, d) for _ in range(3))
        self.to_out = torch.nn.ModuleList([torch.nn.Linear(d, d)])


class _Block(torch.nn.Module):
    def __init__(self, d=6):
        super().__init__()
        self.attn = _Attn(d)
        self.ff = torch.nn.Linear(d, d)

    def forward(self, x):
        a = self.attn
        return self.ff(a.to_out[0](a.to_q(x) * torch.sigmoid(a.to_k(x)) + a.to_v(x)))


def _block(seed=0):
    torch.manual_seed(seed)
    return _Block()


def test_lora_starts_as_the_base_model_and_trains_only_the_adapters_of_the_targets():
    model, base = _block(), _block()
    x = torch.randn(5, 6)
    add_lora(model, rank=2, alpha=4.0, targets=["to_q", "to_v"])
    torch.testing.assert_close(model(x), base(x), rtol=0, atol=0)     # B = 0: the adapted model starts as the base
    trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    want = sorted(f"attn.{m}.lora_{ab}.default.weight" for m in ("to_q", "to_v") for ab in "AB")
    assert trainable == want
    for m in ("to_q", "to_v"):
        layer = getattr(model.attn, m)
        assert layer.lora_A["default"].weight.shape == (2, 6) and layer.lora_B["default"].weight.shape == (6, 2)
        assert layer.lora_A["default"].weight.abs().sum() > 0            # A random, so B gets a gradient
    assert not hasattr(model.attn.to_k, "lora_A") and not hasattr(model.ff, "lora_A")


@pytest.mark.parametrize("rank, alpha", [(2, 4.0), (3, 1.5)])
def test_fusing_adds_alpha_over_rank_times_b_a_and_drops_the_wrappers(rank, alpha):
    model, base = _block(), _block()
    add_lora(model, rank=rank, alpha=alpha, targets=TARGETS)
    torch.manual_seed(1)
    adapters = {}
    for name in ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0"):
        layer = model.get_submodule(name)
        a, b = torch.randn(rank, 6), torch.randn(6, rank)
        with torch.no_grad():
            layer.lora_A["default"].weight.copy_(a)
            layer.lora_B["default"].weight.copy_(b)
        adapters[name] = (a, b)
    x = torch.randn(5, 6)
    adapted = model(x).detach()
    saved = lora_state_dict(model)
    assert set(saved) == {f"{n}.lora_{ab}.weight" for n in adapters for ab in "AB"}
    fuse_lora_(model)
    assert not any("lora" in k for k in model.state_dict())
    assert all(type(model.get_submodule(n)) is torch.nn.Linear for n in adapters)
    for name, (a, b) in adapters.items():
        torch.testing.assert_close(saved[f"{name}.lora_A.weight"], a)
        torch.testing.assert_close(model.get_submodule(name).weight,
                                   base.get_submodule(name).weight + (alpha / rank) * b @ a)
        torch.testing.assert_close(model.get_submodule(name).bias, base.get_submodule(name).bias)
    torch.testing.assert_close(model.ff.weight, base.ff.weight)
    torch.testing.assert_close(model(x), adapted, rtol=1e-5, atol=1e-5)   # the fused layer computes what the adapter did


def test_lora_file_holds_the_adapters(tmp_path):
    from safetensors.torch import load_file

    model = _block()
    add_lora(model, rank=2, alpha=2.0, targets=["to_k"])
    path = save_lora(model, tmp_path / "lora")
    loaded = load_file(str(path))
    layer = model.attn.to_k
    torch.testing.assert_close(loaded["attn.to_k.lora_A.weight"], layer.lora_A["default"].weight)
    torch.testing.assert_close(loaded["attn.to_k.lora_B.weight"], layer.lora_B["default"].weight)


def test_lora_targets_that_match_no_module_fail_naming_the_key():
    with pytest.raises(ValueError, match=r"finetune\.lora_targets"):
        add_lora(_block(), rank=2, alpha=2.0, targets=["to_nowhere"])


# --- optimizer and schedule ------------------------------------------------------------------------

def test_the_optimizer_takes_the_config_and_only_the_trainable_parameters():
    model = _block()
    model.ff.requires_grad_(False)
    optim = SimpleNamespace(lr=3e-4, betas=[0.8, 0.95], eps=1e-7, weight_decay=0.03)
    opt = make_optimizer(model.parameters(), optim)
    (group,) = opt.param_groups
    assert (group["lr"], group["betas"], group["eps"], group["weight_decay"]) == (3e-4, (0.8, 0.95), 1e-7, 0.03)
    want = {id(p) for p in model.attn.parameters()}
    assert {id(p) for p in group["params"]} == want
    with pytest.raises(ValueError, match="no trainable parameters"):
        make_optimizer(model.ff.parameters(), optim)


@pytest.mark.parametrize("warmup", [0, 2])
def test_cosine_holds_its_floor_past_max_steps_and_constant_holds_one(warmup):
    total, r = 10, 0.2
    for s in range(total, total + 12):
        assert lr_factor(s, warmup=warmup, total=total, schedule="cosine", min_ratio=r) == pytest.approx(r)
    for s in range(warmup, total + 5):
        assert lr_factor(s, warmup=warmup, total=total, schedule="constant", min_ratio=r) == 1.0
    # the warm-up's last step reaches the full lr, the step after it is the cosine's start
    if warmup:
        assert lr_factor(warmup - 1, warmup=warmup, total=total, schedule="cosine", min_ratio=r) == pytest.approx(1.0)
    q = warmup + (total - warmup) / 4
    assert lr_factor(q, warmup=warmup, total=total, schedule="cosine", min_ratio=r) == \
        pytest.approx(r + (1 - r) * (1 + math.cos(math.pi / 4)) / 2)


# --- objectives ------------------------------------------------------------------------------------

def _cfg(**kw):
    base = dict(kind="flow", timestep_sampling="logit-normal", logit_mean=0.0, logit_std=1.0, shift=1.0,
                max_shift=None, shift_seq_len=[256, 4096], num_train_timesteps=1000, class_dropout=0.0)
    return SimpleNamespace(**{**base, **kw})


def _logit(p):
    p = p.double()
    return torch.log(p) - torch.log1p(-p)


def test_flow_input_is_the_sigma_mix_and_the_target_is_noise_minus_data():
    obj = Objective(_cfg(shift=2.0))
    positions = list(range(6))
    torch.manual_seed(0)
    x0 = torch.randn(6, 2, 3, 3)
    zero = obj.noise(torch.zeros_like(x0), 7, 3, positions)   # x0 = 0: the target is the noise itself
    got = obj.noise(x0, 7, 3, positions)
    e = zero.target
    sigma = (got.timesteps / 1000).view(-1, 1, 1, 1)
    torch.testing.assert_close(got.timesteps, zero.timesteps)
    assert ((sigma > 0) & (sigma < 1)).all()
    torch.testing.assert_close(got.target, e - x0)
    torch.testing.assert_close(got.inputs, (1 - sigma) * x0 + sigma * e, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(zero.inputs, sigma * e, rtol=1e-5, atol=1e-5)


def test_flow_sigma_is_logit_normal_with_the_configured_mean_and_std_then_shifted():
    n = 3000
    x0 = torch.zeros(n, 1)
    mean, std, shift = 0.4, 0.7, 3.0
    plain = Objective(_cfg(logit_mean=mean, logit_std=std, shift=1.0)).noise(x0, 1, 2, list(range(n))).timesteps / 1000
    shifted = Objective(_cfg(logit_mean=mean, logit_std=std, shift=shift)).noise(x0, 1, 2, list(range(n))).timesteps / 1000
    z = _logit(plain)
    assert abs(float(z.mean()) - mean) < 0.06 and abs(float(z.std()) - std) < 0.05
    # sigma = s u / (1 + (s - 1) u)  <=>  sigma / (1 - sigma) = s u / (1 - u): the shift adds ln s to the logit
    torch.testing.assert_close(_logit(shifted) - z, torch.full_like(z, math.log(shift)), rtol=0, atol=2e-3)
    u = plain.double()
    torch.testing.assert_close(shifted.double(), shift * u / (1 + (shift - 1) * u), rtol=0, atol=1e-5)


def test_uniform_timestep_sampling_draws_u_uniformly_in_0_1():
    n = 3000
    sigma = Objective(_cfg(timestep_sampling="uniform")).noise(torch.zeros(n, 1), 2, 0, list(range(n))).timesteps / 1000
    assert ((sigma >= 0) & (sigma < 1)).all()
    for q in (0.1, 0.25, 0.5, 0.9):
        assert abs(float((sigma < q).double().mean()) - q) < 0.03


def test_the_shift_follows_the_token_count_from_shift_to_max_shift():
    obj = Objective(_cfg(shift=2.0, max_shift=8.0, shift_seq_len=[100, 900]))
    assert obj.shift(100) == pytest.approx(2.0)
    assert obj.shift(900) == pytest.approx(8.0)
    assert obj.shift(500) == pytest.approx(4.0)         # ln linear: the geometric mean half way
    assert obj.shift(10) == pytest.approx(2.0) and obj.shift(10_000) == pytest.approx(8.0)
    assert obj.shift(None) == 2.0
    assert Objective(_cfg(shift=2.0)).shift(900) == 2.0


def _alpha_bar(T):
    """DiT's linear betas 1e-4 .. 0.02 over T steps, alpha_bar_t = prod_{i <= t} (1 - beta_i), in plain floats."""
    betas = [1e-4 + (0.02 - 1e-4) * i / (T - 1) for i in range(T)]
    out, acc = [], 1.0
    for b in betas:
        acc *= 1.0 - b
        out.append(acc)
    return out


def test_ddpm_noises_with_the_alpha_bar_of_each_timestep_and_targets_the_noise():
    T = 1000
    ab = _alpha_bar(T)
    obj = Objective(_cfg(kind="ddpm", num_train_timesteps=T))
    positions = list(range(64))
    torch.manual_seed(0)
    x0 = torch.randn(64, 2, 2)
    zero = obj.noise(torch.zeros_like(x0), 4, 9, positions)
    got = obj.noise(x0, 4, 9, positions)
    e = zero.target
    torch.testing.assert_close(got.target, e)
    t = got.timesteps.long()
    assert torch.equal(got.timesteps, t.float()) and torch.equal(t, zero.timesteps.long())
    a = torch.tensor([ab[i] for i in t.tolist()], dtype=torch.float32).view(-1, 1, 1)
    torch.testing.assert_close(got.inputs, a.sqrt() * x0 + (1 - a).sqrt() * e, rtol=1e-5, atol=1e-5)
    # the alpha-bar the objective holds, also against diffusers' linear schedule
    torch.testing.assert_close(obj.alphas_cumprod.double(), torch.tensor(ab, dtype=torch.float64), rtol=1e-6, atol=1e-7)
    from diffusers import DDPMScheduler
    ref = DDPMScheduler(num_train_timesteps=T, beta_start=1e-4, beta_end=0.02, beta_schedule="linear").alphas_cumprod
    torch.testing.assert_close(obj.alphas_cumprod, ref.float(), rtol=1e-5, atol=1e-6)


def test_ddpm_timesteps_cover_0_to_t_minus_1():
    T = 5
    obj = Objective(_cfg(kind="ddpm", num_train_timesteps=T))
    ts = obj.noise(torch.zeros(300, 1), 0, 1, list(range(300))).timesteps
    assert sorted(set(ts.long().tolist())) == list(range(T))
    ab = _alpha_bar(T)
    x0 = torch.ones(300, 1)
    got = obj.noise(x0, 0, 1, list(range(300)))
    e = obj.noise(torch.zeros_like(x0), 0, 1, list(range(300))).target
    first = got.timesteps == 0       # t = 0 is the least noisy step: alpha_bar_0 = 1 - beta_0
    torch.testing.assert_close(got.inputs[first], math.sqrt(ab[0]) * x0[first] + math.sqrt(1 - ab[0]) * e[first])

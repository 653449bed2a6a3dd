"""Small pieces of the training loop that the end-to-end runs do not pin down on their own: the EMA's
update rule, decay warm-up and update count, its weights put back after sampling, the step from which
it averages (optim.ema_start), the learning-rate schedule the optimizer steps with, and the
objective.size_weighting factor reaching the loss that is back-propagated."""

from contextlib import nullcontext
from types import SimpleNamespace

import math

import pytest
import torch

from mediagen.training import load_config, train
from mediagen.training.checkpoint import list_checkpoints, read_ema, read_model, read_state
from mediagen.training.ema import EMA
from mediagen.training.objectives import Objective
from mediagen.training.schedule import lr_factor, make_lr_scheduler
from mediagen.training.trainer import Run, compute_loss, size_weight
from training_helpers import TINY_DIT, tiny_config


# --- EMA --------------------------------------------------------------------------------------

def _linear(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Linear(3, 2)


def test_ema_update_is_d_shadow_plus_one_minus_d_weights_with_warmup_decay():
    model = _linear()
    frozen = torch.nn.Linear(1, 1)
    model.extra = frozen
    frozen.requires_grad_(False)
    ema = EMA(model, decay=0.9)
    assert set(ema.shadow) == {"weight", "bias"}                  # trainable weights only
    start = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    expected = dict(start)
    for n_done in range(5):
        # the warm-up: min(decay, (1 + n) / (10 + n)) after n updates
        d = min(0.9, (1 + n_done) / (10 + n_done))
        assert ema.updates == n_done
        assert ema.current_decay() == pytest.approx(d)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0 + n_done)                                # new weights each "step"
        ema.update(model)
        params = dict(model.named_parameters())
        expected = {n: d * expected[n] + (1 - d) * params[n].detach() for n in expected}
        for n in expected:
            torch.testing.assert_close(ema.shadow[n], expected[n])
    assert ema.updates == 5
    # the early decays are below the configured one, then it is reached and stays
    assert EMA(model, 0.9).current_decay() == pytest.approx(0.1)
    ema.updates = 1000
    assert ema.current_decay() == 0.9


def test_ema_first_update_leans_to_the_new_weights():
    """After one update from the initial weights the average is mostly the new weights (decay 0.1 at
    first), not mostly the random initialisation."""
    model = _linear()
    ema = EMA(model, decay=0.999)
    with torch.no_grad():
        model.weight.fill_(1.0)
    before = ema.shadow["weight"].clone()
    ema.update(model)
    assert (ema.shadow["weight"] - 1.0).abs().max() < (before - 1.0).abs().max()
    torch.testing.assert_close(ema.shadow["weight"], 0.1 * before + 0.9 * torch.ones_like(before))


def test_ema_applied_puts_the_training_weights_back():
    model = _linear()
    ema = EMA(model, decay=0.9)
    with torch.no_grad():
        model.weight.add_(5.0)
    ema.update(model)
    trained = {n: p.detach().clone() for n, p in model.named_parameters()}
    with ema.applied(model) as m:
        assert torch.equal(m.weight, ema.shadow["weight"])
        assert not torch.equal(m.weight, trained["weight"])
    for n, p in model.named_parameters():
        assert torch.equal(p, trained[n])
    with pytest.raises(RuntimeError):                               # put back on an error too
        with ema.applied(model):
            raise RuntimeError("sampling failed")
    assert torch.equal(model.weight, trained["weight"])


def test_ema_state_round_trip_keeps_weights_and_update_count():
    model = _linear()
    ema = EMA(model, decay=0.99)
    for _ in range(3):
        with torch.no_grad():
            model.weight.mul_(1.5)
        ema.update(model)
    other = EMA(_linear(seed=1), decay=0.99)
    other.load_state_dict(ema.state_dict(), ema.updates)
    assert other.updates == 3 and other.current_decay() == ema.current_decay()
    assert all(torch.equal(other.shadow[n], ema.shadow[n]) for n in ema.shadow)


# --- optim.ema_start in a run ------------------------------------------------------------------

def test_ema_averages_only_the_steps_after_ema_start(tmp_path):
    """ema_start=2 over 4 steps: steps 1 and 2 leave the EMA at the initial weights (no update counted),
    steps 3 and 4 update it; each checkpoint records the count so far."""
    out = tmp_path / "run"
    cfg = tiny_config(out, TINY_DIT, "train.batch_size=4", "train.max_steps=4", "checkpoint.every=1",
                      "checkpoint.keep_last=0", "checkpoint.save_pipeline=false", "optim.ema_decay=0.9",
                      "optim.ema_start=2")
    train(cfg)
    found = dict(list_checkpoints(out))
    assert sorted(found) == [1, 2, 3, 4]
    assert [read_state(found[s])["ema_updates"] for s in (1, 2, 3, 4)] == [0, 0, 1, 2]
    ema1, ema2, ema3 = (read_ema(found[s]) for s in (1, 2, 3))
    assert all(torch.equal(ema1[k], ema2[k]) for k in ema1)          # no update up to ema_start
    model1 = read_model(found[1])
    assert any(not torch.equal(ema1[k], model1[k]) for k in ema1)   # ...so not step 1's weights either
    # step 3's update from the untouched initial average, with the first warm-up decay (0.1)
    model3 = read_model(found[3])
    for k in ema3:
        torch.testing.assert_close(ema3[k], 0.1 * ema2[k] + 0.9 * model3[k].float())


# --- learning-rate schedule ------------------------------------------------------------------

def _lrs_stepped_with(schedule, warmup, total, min_ratio, lr=1.0):
    """The learning rate of each optimizer step 1..total, as the training loop steps them."""
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=lr)
    optim = SimpleNamespace(warmup_steps=warmup, schedule=schedule, min_lr_ratio=min_ratio)
    sched = make_lr_scheduler(opt, optim, total)
    used = []
    for _ in range(total):
        used.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return used, opt.param_groups[0]["lr"]


def test_warmup_is_linear_and_never_steps_with_lr_zero():
    used, _ = _lrs_stepped_with("constant", warmup=4, total=8, min_ratio=0.0, lr=2.0)
    assert used[:4] == pytest.approx([2.0 * k / 4 for k in (1, 2, 3, 4)])  # step k of the warm-up: lr k/warmup
    assert used[4:] == pytest.approx([2.0] * 4)


@pytest.mark.parametrize("warmup", [0, 3])
def test_cosine_goes_from_lr_after_warmup_to_the_floor_at_max_steps(warmup):
    total, r = 23, 0.25
    assert lr_factor(warmup, warmup=warmup, total=total, schedule="cosine", min_ratio=r) == pytest.approx(1.0)
    assert lr_factor(total, warmup=warmup, total=total, schedule="cosine", min_ratio=r) == pytest.approx(r)
    mid = warmup + (total - warmup) / 2
    assert lr_factor(mid, warmup=warmup, total=total, schedule="cosine", min_ratio=r) == pytest.approx((1 + r) / 2)
    for s in range(warmup, total + 1):   # the docstring's formula, p = (s - warmup) / (max - warmup)
        p = (s - warmup) / (total - warmup)
        want = r + (1 - r) * (1 + math.cos(math.pi * p)) / 2
        assert lr_factor(s, warmup=warmup, total=total, schedule="cosine", min_ratio=r) == pytest.approx(want)
    used, last = _lrs_stepped_with("cosine", warmup, total, r)
    assert all(a >= b for a, b in zip(used[warmup:], used[warmup + 1:]))   # decays after the warm-up
    assert min(used) > 0 and last == pytest.approx(r)


def test_scheduler_state_restores_the_schedule_position():
    """What a checkpoint's state.json keeps of the scheduler continues it where it was."""
    optim = SimpleNamespace(warmup_steps=2, schedule="cosine", min_lr_ratio=0.1)

    def fresh():
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.SGD([p], lr=1.0)
        return opt, make_lr_scheduler(opt, optim, 10)

    opt, sched = fresh()
    for _ in range(6):
        opt.step()
        sched.step()
    opt2, sched2 = fresh()
    sched2.load_state_dict(sched.state_dict())
    assert sched2.last_epoch == 6
    opt2.step()
    sched2.step()
    opt.step()
    sched.step()
    assert sched2.get_last_lr() == pytest.approx(sched.get_last_lr())
    assert opt2.param_groups[0]["lr"] == pytest.approx(opt.param_groups[0]["lr"])


# --- objective.size_weighting -----------------------------------------------------------------

class _Const(torch.nn.Module):
    """A stand-in class-conditional transformer: predicts a learned constant."""

    def __init__(self):
        super().__init__()
        self.config = SimpleNamespace(num_embeds_ada_norm=10)
        self.c = torch.nn.Parameter(torch.tensor(0.3))

    def forward(self, x, timestep=None, class_labels=None, return_dict=False):
        return (torch.zeros_like(x) + self.c,)


def _stub_run(cfg):
    model = _Const()
    acc = SimpleNamespace(device=torch.device("cpu"), autocast=nullcontext)
    comp = SimpleNamespace(task="class-to-image", teacher=None)
    conditioner = SimpleNamespace(latents=lambda pixels, index, device: pixels.to(device))
    return Run(cfg, acc, comp, model, model, None, None, Objective(cfg.objective), conditioner)


@pytest.mark.parametrize("power", [0.0, 1.0])
def test_size_weighting_scales_the_loss_that_is_backpropagated(power):
    cfg = load_config(None, ["output_dir=x", "model.preset=dit-tiny", "task=class-to-image", "data.dataset=mnist",
                             "data.resolution=8", f"objective.size_weighting={power}"])
    run = _stub_run(cfg)
    batch = {"pixels": torch.rand(2, 1, 4, 4), "label": torch.tensor([1, 2]), "index": [0, 1]}
    weight = size_weight(cfg, batch)
    assert weight == (0.25 if power else 1.0)                      # 4x4 clips against the configured 8x8
    total, mse, distill = compute_loss(run, dict(batch), step=1, positions=[0, 1])
    assert distill is None and not mse.requires_grad
    torch.testing.assert_close(total.detach(), mse * weight)       # the logged mse is the unweighted one
    total.backward()
    grad = run.model.c.grad.clone()
    run.model.c.grad = None
    plain = run.model.c.detach().clone().requires_grad_(True)
    # the gradient is that of the weighted loss
    noised = run.objective.noise(batch["pixels"].float(), cfg.train.seed, 1, [0, 1])
    ref = torch.nn.functional.mse_loss(torch.zeros_like(noised.target) + plain, noised.target.float()) * weight
    ref.backward()
    torch.testing.assert_close(grad, plain.grad)


def test_size_weighting_of_images_ignores_num_frames():
    """An image batch (N, C, H, W) at the configured resolution weighs 1 whatever data.num_frames says."""
    cfg = load_config(None, ["output_dir=x", "model.preset=dit-tiny", "task=class-to-image", "data.dataset=mnist",
                             "data.resolution=8", "data.num_frames=8", "objective.size_weighting=1"])
    assert size_weight(cfg, {"pixels": torch.zeros(2, 1, 8, 8)}) == 1.0
    assert size_weight(cfg, {"pixels": torch.zeros(2, 1, 4, 8)}) == 0.5

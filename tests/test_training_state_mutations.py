"""State handling of the training loop that the end-to-end and resume tests leave open, each test failing on a
one-line slip in trainer/checkpoint/ema/schedule/objectives: gradient accumulation trains like one batch, clipping
caps the gradient AdamW steps with, the LR schedule advances once per optimizer step, keep_last keeps the
newest checkpoints, the optimizer takes the configured hyper-parameters, the EMA averages low-precision
weights, checkpoints restore the RNG, and each sample's noise, timestep and dropout follow the documented
rules (and the sampler's schedule) with a distinct generator per (seed, step, position)."""

import json
import math
from types import SimpleNamespace

import pytest
import torch

from mediagen.training import checkpoint as ckpt
from mediagen.training import load_config, train
from mediagen.training.checkpoint import list_checkpoints, read_model, read_optimizer, read_state
from mediagen.training.ema import EMA
from mediagen.training.objectives import Objective, sample_generator, sample_key
from mediagen.training.schedule import lr_factor, make_optimizer
from training_helpers import TINY_DIT, tiny_config


def _metrics(output_dir) -> dict[int, dict]:
    rows = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows}


# --- the training loop --------------------------------------------------------------------------

@pytest.mark.parametrize("distill", [False, True])
def test_gradient_accumulation_trains_like_one_batch(tmp_path, distill):
    """A global batch of 16 in 4 micro-batches of 4 gives the losses (flow and distillation), the gradient
    norm and the weights of one batch of 16: each micro-batch's loss counts 1/4 and its samples keep their
    positions in the global batch (their noise)."""
    extra = []
    if distill:   # a conversion with a teacher (the plain model of a 1-step run) adds the distillation loss
        base = tmp_path / "base"
        train(tiny_config(base, TINY_DIT, "train.max_steps=1", "checkpoint.every=100"))
        extra = ["model.preset=null", f"model.pretrained={base / 'pipeline'}", "finetune.mode=convert",
                 "model.attention=mhla", "model.blocks=[2,2]", "finetune.distill_weight=1.0"]
    runs = {}
    for micro in (16, 4):
        out = tmp_path / f"micro{micro}"
        train(tiny_config(out, TINY_DIT, *extra, "train.max_steps=3", f"train.micro_batch_size={micro}",
                          "checkpoint.every=3", "checkpoint.save_pipeline=false"))
        runs[micro] = _metrics(out), read_model(list_checkpoints(out)[-1][1])
    (one, w_one), (acc, w_acc) = runs[16], runs[4]
    assert sorted(one) == sorted(acc) == [1, 2, 3]
    keys = ["loss", "grad_norm"] + (["distill"] if distill else [])
    for s in one:
        for k in keys:
            assert acc[s][k] == pytest.approx(one[s][k], rel=1e-3), (s, k)
    assert one[1]["grad_norm"] > 0
    assert w_acc.keys() == w_one.keys()      # the same weights, to the rounding of the split sums
    diff = math.sqrt(sum(float(((w_acc[k] - w_one[k]).double() ** 2).sum()) for k in w_one))
    norm = math.sqrt(sum(float((w.double() ** 2).sum()) for w in w_one.values()))
    assert diff < 1e-4 * norm


def _adam_first_moments_norm(folder) -> float:
    """The norm of the gradient AdamW stepped with at step 1: exp_avg = (1 - beta1) g after one step."""
    state = read_optimizer(folder)
    beta1 = state["param_groups"][0]["betas"][0]
    total = sum(float((s["exp_avg"].double() ** 2).sum()) for s in state["state"].values())
    return math.sqrt(total) / (1 - beta1)


def test_clipping_caps_the_gradient_the_optimizer_steps_with(tmp_path):
    """optim.max_grad_norm=c: the logged grad_norm is the gradient's norm before clipping, and AdamW's first
    step uses the gradient scaled to norm c; with a cap above the norm the gradient is used as it is."""
    norms = {}
    for cap in (0.01, 1e6):
        out = tmp_path / f"cap{cap}"
        train(tiny_config(out, TINY_DIT, "train.max_steps=1", "checkpoint.every=1", "checkpoint.save_pipeline=false",
                          f"optim.max_grad_norm={cap}"))
        norms[cap] = _metrics(out)[1]["grad_norm"], _adam_first_moments_norm(list_checkpoints(out)[-1][1])
    logged, used = norms[1e6]
    assert logged > 0.1 and used == pytest.approx(logged, rel=1e-4)       # not clipped: the raw gradient
    logged_capped, used_capped = norms[0.01]
    assert logged_capped == pytest.approx(logged, rel=1e-5)                # the same step, the same gradient
    assert used_capped == pytest.approx(0.01, rel=1e-3)                    # ...clipped to the cap


def test_the_loop_steps_the_lr_schedule_once_per_optimizer_step(tmp_path):
    """After step s the scheduler has advanced s times: the optimizer's lr (kept by the checkpoint) is
    lr * lr_factor(s), so a run resumed at s continues the warm-up and cosine where they were. metrics.jsonl
    logs the rate step s trained with, lr * lr_factor(s - 1), not the next step's."""
    out = tmp_path / "run"
    cfg = tiny_config(out, TINY_DIT, "train.batch_size=4", "train.max_steps=6", "checkpoint.every=1",
                      "checkpoint.keep_last=0", "checkpoint.save_pipeline=false", "optim.warmup_steps=3",
                      "optim.schedule=cosine", "optim.min_lr_ratio=0.1")
    train(cfg)
    found = list_checkpoints(out)
    assert [s for s, _ in found] == [1, 2, 3, 4, 5, 6]
    metrics = _metrics(out)
    for step, folder in found:
        want = cfg.optim.lr * lr_factor(step, warmup=3, total=6, schedule="cosine", min_ratio=0.1)
        assert read_state(folder)["scheduler"]["last_epoch"] == step
        assert read_optimizer(folder)["param_groups"][0]["lr"] == pytest.approx(want)
        assert metrics[step]["lr"] == pytest.approx(
            cfg.optim.lr * lr_factor(step - 1, warmup=3, total=6, schedule="cosine", min_ratio=0.1))


def test_a_resumed_run_trains_with_the_optimizer_settings_of_its_config(tmp_path):
    """The checkpoint carries the optimizer's moments and the schedule's position; optim.lr, betas, eps and
    weight_decay are the config's. A run resumed with other values (a lower lr to go on with) trains with
    them, as the config.yaml it writes says, instead of the ones saved with the optimizer's state."""
    out = tmp_path / "run"
    common = ["train.batch_size=4", "checkpoint.every=1", "checkpoint.keep_last=0", "checkpoint.save_pipeline=false",
              "optim.schedule=cosine", "optim.warmup_steps=2"]
    train(tiny_config(out, TINY_DIT, *common, "train.max_steps=2", "optim.lr=2e-3"))
    changed = ["train.max_steps=4", "optim.lr=5e-4", "optim.betas=[0.8,0.95]", "optim.eps=1e-6",
               "optim.weight_decay=0.1"]
    train(tiny_config(out, TINY_DIT, *common, *changed, "checkpoint.resume=latest"))
    metrics = _metrics(out)
    for step in (3, 4):
        group = read_optimizer(dict(list_checkpoints(out))[step])["param_groups"][0]
        want = 5e-4 * lr_factor(step, warmup=2, total=4, schedule="cosine", min_ratio=0.0)
        used = 5e-4 * lr_factor(step - 1, warmup=2, total=4, schedule="cosine", min_ratio=0.0)
        assert group["lr"] == pytest.approx(want) and metrics[step]["lr"] == pytest.approx(used)
        assert group["initial_lr"] == pytest.approx(5e-4)
        assert list(group["betas"]) == pytest.approx([0.8, 0.95])
        assert group["eps"] == pytest.approx(1e-6) and group["weight_decay"] == pytest.approx(0.1)
    assert read_state(dict(list_checkpoints(out))[4])["scheduler"]["base_lrs"] == pytest.approx([5e-4])


# --- checkpoints ------------------------------------------------------------------------------

@pytest.mark.parametrize("keep_last", [0, 1, 2])
def test_keep_last_keeps_the_newest_checkpoints(tmp_path, keep_last):
    for step in (10, 20, 30, 40):
        ckpt.prepare_tmp(tmp_path, step)
        ckpt.publish(tmp_path, step, keep_last)
    kept = [s for s, _ in list_checkpoints(tmp_path)]
    assert kept == ([10, 20, 30, 40] if keep_last == 0 else [10, 20, 30, 40][-keep_last:])


def test_a_run_resumed_from_an_earlier_checkpoint_replaces_the_later_ones(tmp_path):
    """Resuming from an earlier checkpoint folder of the same output_dir goes back in the run: the checkpoints past
    it belong to the abandoned future. The resumed run's own checkpoint is kept (keep_last=1 must not count the
    later ones as newer and delete it) and ``resume=latest`` continues the resumed run, not the abandoned one."""
    out = tmp_path / "run"
    common = ["train.batch_size=4", "checkpoint.save_pipeline=false"]
    train(tiny_config(out, TINY_DIT, *common, "train.max_steps=8", "checkpoint.every=4", "checkpoint.keep_last=0"))
    found = dict(list_checkpoints(out))
    assert sorted(found) == [4, 8]
    # back to step 4; a time limit already past stops the run after step 5, with its checkpoint
    result = train(tiny_config(out, TINY_DIT, *common, "train.max_steps=8", "checkpoint.every=100",
                               "checkpoint.keep_last=1", f"checkpoint.resume={found[4]}",
                               "train.time_limit_minutes=1e-6"))
    assert not result["finished"] and result["step"] == 5
    assert [s for s, _ in list_checkpoints(out)] == [5]
    again = train(tiny_config(out, TINY_DIT, *common, "train.max_steps=8", "checkpoint.every=100",
                              "checkpoint.keep_last=1", "checkpoint.resume=latest"))
    assert again["start"] == 5 and sorted(again["losses"]) == [6, 7, 8]
    assert [s for s, _ in list_checkpoints(out)] == [8]


def test_checkpoint_restores_every_rng(tmp_path):
    """rng-<rank> files put the torch, numpy and python generators back where they were at the save."""
    import random

    import numpy as np

    torch.manual_seed(3), np.random.seed(3), random.seed(3)
    ckpt.write_rng(tmp_path, 0)
    want = torch.rand(4), np.random.rand(4), [random.random() for _ in range(4)]
    torch.manual_seed(4), np.random.seed(4), random.seed(4)
    ckpt.restore_rng(tmp_path, 0)
    got = torch.rand(4), np.random.rand(4), [random.random() for _ in range(4)]
    assert torch.equal(got[0], want[0]) and np.array_equal(got[1], want[1]) and got[2] == want[2]


# --- optimizer and EMA ----------------------------------------------------------------------

def test_optimizer_takes_the_configured_hyper_parameters_and_only_trainable_weights():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    model[0].requires_grad_(False)
    optim = SimpleNamespace(lr=3e-3, betas=[0.8, 0.95], eps=1e-6, weight_decay=0.05)
    opt = make_optimizer(model.parameters(), optim)
    group = opt.param_groups[0]
    assert (group["lr"], tuple(group["betas"]), group["eps"], group["weight_decay"]) == (3e-3, (0.8, 0.95), 1e-6, 0.05)
    assert [id(p) for p in group["params"]] == [id(p) for p in model[1].parameters()]
    model.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        make_optimizer(model.parameters(), optim)


def test_ema_of_bf16_weights_averages_in_fp32():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).to(torch.bfloat16)
    ema = EMA(model, decay=0.9)
    assert all(s.dtype == torch.float32 for s in ema.shadow.values())
    start = {n: s.clone() for n, s in ema.shadow.items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    ema.update(model)                                   # first update: decay min(0.9, 1/10) = 0.1
    for n, p in model.named_parameters():
        torch.testing.assert_close(ema.shadow[n], 0.1 * start[n] + 0.9 * p.detach().float())


# --- objectives -------------------------------------------------------------------------------

def _objective(*extra):
    return Objective(load_config(None, ["output_dir=x", "model.preset=dit-tiny", *extra]).objective)


def test_sample_keys_differ_for_every_seed_step_and_position():
    """No two (seed, step, position) share a generator: a run with another seed, a later step or another
    position in the batch never repeats a sample's noise."""
    keys = {sample_key(seed, step, pos) for seed in range(4) for step in range(64) for pos in range(64)}
    assert len(keys) == 4 * 64 * 64


@pytest.mark.parametrize("sampling", ["logit-normal", "uniform"])
def test_flow_noising_follows_the_documented_rule(sampling):
    """x_t = (1 - sigma) x0 + sigma e, target e - x0, timestep 1000 sigma, with e and then u drawn from the
    sample's generator (seed, step, position) and sigma = shift u / (1 + (shift - 1) u)."""
    obj = _objective("objective.kind=flow", f"objective.timestep_sampling={sampling}", "objective.shift=3",
                     "objective.logit_mean=0.5", "objective.logit_std=1.5")
    x0 = torch.randn(3, 2, 4, 4)
    seed, step, positions = 5, 9, [4, 5, 6]
    got = obj.noise(x0, seed, step, positions)
    for i, pos in enumerate(positions):
        g = sample_generator(seed, step, pos)
        e = torch.randn(x0.shape[1:], generator=g)
        u = (torch.sigmoid(0.5 + 1.5 * torch.randn((), generator=g)) if sampling == "logit-normal"
             else torch.rand((), generator=g))
        sigma = 3 * u / (1 + 2 * u)
        torch.testing.assert_close(got.inputs[i], (1 - sigma) * x0[i] + sigma * e)
        torch.testing.assert_close(got.target[i], e - x0[i])
        torch.testing.assert_close(got.timesteps[i], 1000 * sigma)


def test_ddpm_noising_matches_the_samplers_schedule():
    """DDPM: t uniform in 0..T-1 from the sample's generator (after its noise), x_t as the DDIM sampler's
    scheduler (the linear-beta schedule the pipelines sample with) noises x0 at t, target the noise."""
    from mediagen.pipelines.schedulers import make_scheduler

    obj = _objective("objective.kind=ddpm")
    sched = make_scheduler("ddim")
    x0 = torch.randn(64, 1, 4, 4)
    seed, step, positions = 2, 3, list(range(64))
    got = obj.noise(x0, seed, step, positions)
    noises, ts = [], []
    for pos in positions:
        g = sample_generator(seed, step, pos)
        noises.append(torch.randn(x0.shape[1:], generator=g))
        ts.append(int(torch.randint(0, 1000, (), generator=g)))
    e, t = torch.stack(noises), torch.tensor(ts)
    assert got.timesteps.tolist() == [float(v) for v in ts]
    torch.testing.assert_close(got.target, e)
    torch.testing.assert_close(got.inputs, sched.add_noise(x0, e, t))
    torch.testing.assert_close(obj.alphas_cumprod, sched.alphas_cumprod.float())


def test_condition_dropout_rate_is_class_dropout():
    x0 = torch.zeros(2000, 1, 2, 2)
    positions = list(range(2000))
    for p in (0.0, 1.0):
        drop = _objective(f"objective.class_dropout={p}").noise(x0, 0, 1, positions).drop
        assert drop.all() if p == 1.0 else not drop.any()
    rate = _objective("objective.class_dropout=0.1").noise(x0, 0, 1, positions).drop.float().mean()
    assert 0.08 < float(rate) < 0.12


@pytest.mark.parametrize("kind", ["flow", "ddpm"])
def test_exported_scheduler_has_the_objectives_train_timesteps(tmp_path, kind):
    """objective.num_train_timesteps=T other than 1000: the saved pipeline (final and --export) samples on the
    schedule the model trained on: flow timesteps T * sigma (training's timestep = T sigma), DDPM the
    alpha_bar of T linear betas."""
    from mediagen.pipelines import build_pipeline
    from mediagen.training.export import export_checkpoint

    out = tmp_path / kind
    cfg = tiny_config(out, TINY_DIT, "train.batch_size=4", "train.max_steps=1", "checkpoint.every=1",
                      f"objective.kind={kind}", "objective.num_train_timesteps=500")
    train(cfg)
    for folder in (out / "pipeline", export_checkpoint(cfg, "latest")):
        sched = build_pipeline(str(folder)).scheduler
        assert sched.config.num_train_timesteps == 500
        if kind == "flow":
            sched.set_timesteps(4)
            torch.testing.assert_close(sched.timesteps, sched.sigmas[:-1] * 500)
        else:
            torch.testing.assert_close(sched.alphas_cumprod.float(), Objective(cfg.objective).alphas_cumprod)


def test_an_fp16_runs_loss_scale_survives_a_resume(tmp_path):
    """fp16 trains under a loss scaler whose scale is learned (halved on overflow, grown after quiet steps): the
    checkpoint keeps it and a resume restores it, so the resumed run scales and skips steps as the first would.
    (accelerate refuses fp16 on a CPU, so the runs here are stand-ins holding what save and restore touch.)"""
    from types import SimpleNamespace

    from mediagen.training import checkpoint as ckpt
    from mediagen.training.trainer import restore, save_checkpoint

    def stand_in(scaler):
        model = torch.nn.Linear(2, 2)
        opt = torch.optim.AdamW(model.parameters())
        acc = SimpleNamespace(scaler=scaler, is_main_process=True, process_index=0, device="cpu",
                              get_state_dict=lambda m: m.state_dict(), wait_for_everyone=lambda: None)
        return SimpleNamespace(accelerator=acc, model=model, optimizer=SimpleNamespace(optimizer=opt), ema=None,
                               scheduler=torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0),
                               cfg=SimpleNamespace(output_dir=str(tmp_path), checkpoint=SimpleNamespace(keep_last=1),
                                                   optim=SimpleNamespace(lr=1e-3, betas=[0.9, 0.999], eps=1e-8,
                                                                         weight_decay=0.01)))

    learned = {"scale": 1024.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000,
               "_growth_tracker": 7}
    first = torch.amp.GradScaler("cpu")
    first.load_state_dict(learned)
    save_checkpoint(stand_in(first), 5)
    folder = ckpt.list_checkpoints(tmp_path)[-1][1]
    resumed = torch.amp.GradScaler("cpu")                              # a fresh run starts at 65,536
    restore(stand_in(resumed), folder)
    assert resumed.state_dict() == learned
    # a checkpoint of another precision (no scaler saved) leaves a scaler as it is
    save_checkpoint(stand_in(None), 6)
    other = torch.amp.GradScaler("cpu")
    restore(stand_in(other), ckpt.list_checkpoints(tmp_path)[-1][1])
    assert other.state_dict()["scale"] == 65536.0

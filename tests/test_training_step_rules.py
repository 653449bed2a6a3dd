"""Rules of a training step and of the run around it that the end-to-end and resume tests cannot see, because
two runs with the same slip agree with each other: every step draws its noise from (run seed, its own step,
each sample's position in the global batch); dropped conditions become the null class or the empty prompt
and kept ones stay; a learned-sigma transformer is trained on its mean channels; flow timesteps scale with
objective.num_train_timesteps; samples are drawn with the EMA weights, which are then put back (in training
mode); ``resume: latest`` takes the newest checkpoint; a time limit that passes during the last step still
finishes the run; each epoch of the batch plan uses every full batch once, in a new order; images are
centre-cropped to their bucket."""

from contextlib import nullcontext
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mediagen.training import checkpoint as ckpt
from mediagen.training import load_config, train
from mediagen.training.checkpoint import list_checkpoints, read_ema, read_model
from mediagen.training.data.buckets import resize_cover_crop
from mediagen.training.data.sampler import StepBatches
from mediagen.training.objectives import Objective
from mediagen.training.trainer import Run, predict
from training_helpers import TINY_DIT, tiny_config

FAST = ["train.batch_size=4", "checkpoint.save_pipeline=false"]


# --- what a step draws its randomness from -------------------------------------------------------

def test_each_micro_batch_is_noised_with_the_run_seed_its_step_and_its_global_positions(tmp_path, monkeypatch):
    """The noise, timestep and dropout of a sample come from (train.seed, step, position in the global batch):
    a loop passing a fixed step (every step the same noise), another seed, or micro-batch-local positions
    would still train and resume identically, but on the wrong randomness."""
    calls = []
    noise = Objective.noise

    def recording(self, x0, seed, step, positions, tokens=None):
        calls.append((seed, step, list(positions)))
        return noise(self, x0, seed, step, positions, tokens)

    monkeypatch.setattr(Objective, "noise", recording)
    train(tiny_config(tmp_path / "run", TINY_DIT, *FAST, "train.seed=7", "train.micro_batch_size=2",
                      "train.max_steps=3", "checkpoint.every=100"))
    assert calls == [(7, s, pos) for s in (1, 2, 3) for pos in ([0, 1], [2, 3])]


# --- conditions, dropped and kept ------------------------------------------------------------------

class _Recorder(torch.nn.Module):
    """A stand-in transformer that records what it is given and returns ``out_channels`` channels."""

    def __init__(self, out_channels=None):
        super().__init__()
        self.config = SimpleNamespace(num_embeds_ada_norm=10)
        self.out_channels = out_channels
        self.seen = {}

    def forward(self, x=None, timestep=None, class_labels=None, hidden_states=None, encoder_hidden_states=None,
                return_dict=False):
        x = x if x is not None else hidden_states
        self.seen.update(class_labels=class_labels, context=encoder_hidden_states)
        c = self.out_channels or x.shape[1]
        # channel k holds the value k, so a test can tell which channels came back
        out = torch.arange(c, dtype=x.dtype).view(1, c, *([1] * (x.dim() - 2))).expand(x.shape[0], c, *x.shape[2:])
        return (out,)


def _run(task, model, text_states=None):
    acc = SimpleNamespace(device=torch.device("cpu"), autocast=nullcontext)
    comp = SimpleNamespace(task=task, teacher=None)
    conditioner = SimpleNamespace(text_states=text_states)
    return Run(None, acc, comp, model, model, None, None, None, conditioner)


def test_dropped_samples_get_the_null_class_and_the_others_their_label():
    """Classifier-free guidance needs the null class (num_embeds_ada_norm) exactly where a sample is dropped:
    swapped, the model would learn almost only the unconditional prediction and never the classes."""
    model = _Recorder()
    run = _run("class-to-image", model)
    labels = torch.tensor([3, 1, 4, 1, 5, 9])
    drop = torch.tensor([True, False, False, True, False, True])
    predict(run, model, torch.zeros(6, 1, 2, 2), torch.zeros(6), {"label": labels}, drop, torch.device("cpu"))
    assert model.seen["class_labels"].tolist() == [10, 1, 4, 10, 5, 10]


def test_dropped_samples_read_the_empty_prompt_and_the_others_their_caption():
    read = []

    def text_states(captions, device):
        read.append(list(captions))
        return torch.zeros(len(captions), 2, 3)

    model = _Recorder()
    run = _run("text-to-video", model, text_states)
    batch = {"caption": ["the digit 1 moves up", "the digit 2 moves left", "the digit 3 moves down"]}
    predict(run, model, torch.zeros(3, 1, 2, 2, 2), torch.zeros(3), batch, torch.tensor([False, True, False]),
            torch.device("cpu"))
    assert read == [["the digit 1 moves up", "", "the digit 3 moves down"]]


def test_a_learned_sigma_transformer_is_trained_on_its_mean_channels():
    """DiT with learned sigma returns 2C channels, the mean first; the flow/noise target has C channels and must
    be compared with the mean (the first C), not the variance half. A model of C channels is used as it is."""
    for out_channels, want in ((8, [0, 1, 2, 3]), (4, [0, 1, 2, 3])):
        model = _Recorder(out_channels)
        run = _run("class-to-image", model)
        out = predict(run, model, torch.zeros(2, 4, 2, 2), torch.zeros(2), {"label": torch.tensor([1, 2])},
                      torch.tensor([False, False]), torch.device("cpu"))
        assert out.shape == (2, 4, 2, 2)
        assert out[0, :, 0, 0].tolist() == want


def test_flow_timesteps_scale_with_num_train_timesteps():
    """The transformer sees timestep T sigma, T = objective.num_train_timesteps, as the exported scheduler
    samples with (its timesteps are T sigma too); T = 1000 hard-wired would train another time scale."""
    x0 = torch.randn(4, 1, 2, 2)
    cfgs = {T: load_config(None, ["output_dir=x", "model.preset=dit-tiny", "objective.kind=flow",
                                  f"objective.num_train_timesteps={T}"]).objective for T in (1000, 500)}
    a, b = (Objective(cfgs[T]).noise(x0, 3, 2, [0, 1, 2, 3]) for T in (1000, 500))
    torch.testing.assert_close(a.inputs, b.inputs)                   # the same sigma ...
    torch.testing.assert_close(b.timesteps, a.timesteps / 2)         # ... seen as 500 sigma
    sigma = (b.inputs - x0)[:, 0, 0, 0] / b.target[:, 0, 0, 0]      # x_t - x0 = sigma (e - x0)
    torch.testing.assert_close(b.timesteps, 500 * sigma, rtol=1e-4, atol=1e-3)


# --- samples, resume and the time limit ----------------------------------------------------------

def test_samples_are_drawn_with_the_ema_weights_then_the_training_weights_come_back(tmp_path, monkeypatch):
    """write_samples puts the EMA weights in for sampling (what the exported pipeline will hold), then puts the
    training weights back and leaves the model in training mode."""
    from mediagen.training import export

    seen = []
    make_pipeline = export.make_pipeline

    def recording(components, transformer, scheduler, objective):
        seen.append((transformer, {k: v.detach().clone() for k, v in transformer.state_dict().items()}))
        return make_pipeline(components, transformer, scheduler, objective)

    monkeypatch.setattr(export, "make_pipeline", recording)
    out = tmp_path / "run"
    train(tiny_config(out, TINY_DIT, *FAST, "train.max_steps=2", "checkpoint.every=2", "optim.ema_decay=0.9",
                      "logging.sample_every=2", "logging.sample_steps=1", "logging.sample_classes=[1]"))
    assert len(seen) == 1 and (out / "samples" / "step-0000002" / "class1.png").is_file()
    transformer, sampled = seen[0]
    folder = list_checkpoints(out)[-1][1]
    ema, weights = read_ema(folder), read_model(folder)
    assert all(torch.equal(sampled[k], ema[k]) for k in ema)
    assert any(not torch.equal(ema[k], weights[k]) for k in ema)     # the EMA is not the training weights
    # the checkpoint after sampling holds the training weights, and the model trains on
    assert transformer.training
    assert all(torch.equal(transformer.state_dict()[k], weights[k]) for k in weights)


def _stand_in_run(tmp_path):
    """What save_checkpoint and restore touch of a run: one process, no EMA, no loss scaler."""
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    acc = SimpleNamespace(scaler=None, is_main_process=True, process_index=0, device="cpu",
                          get_state_dict=lambda m: m.state_dict(), wait_for_everyone=lambda: None)
    optim = SimpleNamespace(lr=1e-3, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.01)
    return SimpleNamespace(accelerator=acc, model=model, optimizer=SimpleNamespace(optimizer=opt), ema=None,
                           scheduler=torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0),
                           cfg=SimpleNamespace(output_dir=str(tmp_path), checkpoint=SimpleNamespace(keep_last=0),
                                               optim=optim))


def test_a_resume_puts_the_random_generators_back_where_the_checkpoint_left_them(tmp_path):
    """Anything drawing from the global generators after a resume (dropout, a loader's worker seeds, an
    augmentation) draws what the uninterrupted run drew after that step, not what train.seed gives."""
    import random

    from mediagen.training.trainer import restore, save_checkpoint

    torch.manual_seed(11), np.random.seed(11), random.seed(11)
    torch.rand(5), np.random.rand(5), random.random()                 # the run's generators moved on
    save_checkpoint(_stand_in_run(tmp_path), 3)
    after = torch.rand(4), np.random.rand(4), random.random()
    torch.manual_seed(0), np.random.seed(0), random.seed(0)           # a new process seeds from train.seed
    restore(_stand_in_run(tmp_path), list_checkpoints(tmp_path)[-1][1])
    assert torch.equal(torch.rand(4), after[0])
    assert np.array_equal(np.random.rand(4), after[1]) and random.random() == after[2]


def test_resume_latest_takes_the_newest_checkpoint(tmp_path):
    """Whatever order the folders are listed in, ``latest`` is the highest step, and the listing is by step."""
    steps = [7, 120, 3, 45, 1000, 9, 60, 2, 88, 300, 11, 500]
    for s in steps:
        folder = ckpt.checkpoint_dir(tmp_path) / f"checkpoint-{s:07d}"
        folder.mkdir(parents=True)
        (folder / "state.json").write_text('{"step": %d}' % s)
    assert [s for s, _ in list_checkpoints(tmp_path)] == sorted(steps)
    assert ckpt.find_resume(tmp_path, "latest").name == "checkpoint-0001000"


def test_the_time_limit_is_in_minutes_and_zero_means_none():
    import time

    from mediagen.training.trainer import out_of_time

    one = SimpleNamespace(num_processes=1)
    now = time.monotonic()
    assert not out_of_time(one, now - 30.0, 1.0)                       # half a minute of a one-minute limit
    assert out_of_time(one, now - 90.0, 1.0)
    assert not out_of_time(one, now - 1e6, 0)                          # no limit
    assert out_of_time(one, now, 0, terminated=True)                   # SIGTERM stops whatever the limit


def test_a_time_limit_that_passes_during_the_last_step_finishes_the_run(tmp_path):
    """At train.max_steps nothing is left to resume: the run is finished (its pipeline written), not stopped."""
    out = tmp_path / "run"
    result = train(tiny_config(out, TINY_DIT, "train.batch_size=4", "train.max_steps=1", "checkpoint.every=100",
                               "train.time_limit_minutes=1e-6"))
    assert result["finished"] and result["step"] == 1
    assert (out / "pipeline" / "model_index.json").is_file()
    assert [s for s, _ in list_checkpoints(out)] == [1]


def test_an_earlier_checkpoint_exports_its_own_weights(tmp_path):
    """Without EMA, exporting step 1 of a run that went on to step 2 writes step 1's weights."""
    from safetensors.torch import load_file

    from mediagen.training.export import export_checkpoint

    out = tmp_path / "run"
    cfg = tiny_config(out, TINY_DIT, *FAST, "train.max_steps=2", "checkpoint.every=1", "checkpoint.keep_last=0")
    train(cfg)
    found = dict(list_checkpoints(out))
    first, last = read_model(found[1]), read_model(found[2])
    assert any(not torch.equal(first[k], last[k]) for k in first)
    folder = export_checkpoint(cfg, "1", tmp_path / "at1")
    exported = load_file(str(folder / "transformer" / "diffusion_pytorch_model.safetensors"))
    assert exported.keys() == first.keys() and all(torch.equal(exported[k], first[k]) for k in first)


# --- the batch plan and the crop -------------------------------------------------------------------

def test_each_epoch_uses_every_full_batch_once_in_a_new_order():
    """Steps 1..per_epoch are one epoch: every item of a bucket's full batches exactly once (leftovers of a
    bucket dropped), the buckets' batches mixed rather than one bucket after another; the next epoch shuffles
    again, so the run does not repeat one order of batches."""
    buckets = [0] * 37 + [1] * 21 + [2] * 3
    plan = StepBatches(buckets, global_batch=4, seed=5)
    assert plan.per_epoch == 9 + 5
    for epoch in range(3):
        steps = range(epoch * plan.per_epoch + 1, (epoch + 1) * plan.per_epoch + 1)
        items = np.concatenate([plan.global_indices(s) for s in steps])
        assert len(set(items.tolist())) == len(items) == 4 * plan.per_epoch
        assert all(len({buckets[i] for i in plan.global_indices(s)}) == 1 for s in steps)
        assert np.bincount(np.asarray(buckets)[items], minlength=3).tolist() == [36, 20, 0]
        order = [buckets[plan.global_indices(s)[0]] for s in steps]  # the buckets' batches are interleaved
        assert order != sorted(order) and order != sorted(order, reverse=True)
    first = [plan.global_indices(s).tolist() for s in range(1, plan.per_epoch + 1)]
    second = [plan.global_indices(s).tolist() for s in range(plan.per_epoch + 1, 2 * plan.per_epoch + 1)]
    assert first != second
    assert [sorted(b) for b in first] != [sorted(b) for b in second]  # other batches, not only another order


def test_a_wide_image_is_centre_cropped_to_its_bucket():
    x = torch.arange(4 * 12, dtype=torch.float32).view(1, 4, 12)     # one channel, 4 x 12, no resize needed
    torch.testing.assert_close(resize_cover_crop(x, 4, 4), x[..., 4:8])
    tall = x.transpose(-1, -2).contiguous()                           # 12 x 4
    torch.testing.assert_close(resize_cover_crop(tall, 4, 4), tall[..., 4:8, :])

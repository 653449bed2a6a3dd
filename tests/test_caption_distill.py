"""Caption distillation (finetune.teacher_caption=template): a frozen copy of the starting model reads each
clip's template caption while the student reads the caption the clip was given (a varied wording or the
template), on the same noised clip, timestep and dropped prompts; objective.flow_weight=0 leaves the
distillation alone. The configs configs/train/wan-mmnist-wordings-distill-{mhla,sdpa}.yaml train this way."""

import json
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from mediagen.pipelines.shipping import shipped_checkpoint
from mediagen.training import ConfigError, load_config, train
from mediagen.training.checkpoint import list_checkpoints, read_model
from mediagen.training.data import build_dataset, collate
from mediagen.training.data.moving_mnist import clip_caption
from mediagen.training.objectives import Objective
from mediagen.training.trainer import Run, compute_loss
from training_helpers import TINY_WAN, tiny_config

ROOT = Path(__file__).resolve().parents[1]
DISTILL = ["finetune.mode=full", "model.pretrained=video-mhla", "finetune.distill_weight=1.0",
           "finetune.teacher_caption=template", "data.varied_captions=0.8"]


# --- the batch carries each clip's template caption ------------------------------------------------

def test_varied_clips_carry_their_template_caption_through_items_batches_and_collate():
    cfg = load_config(None, ["output_dir=x", *TINY_WAN, "data.varied_captions=0.7", "data.static_fraction=0.2"])
    data = build_dataset(cfg.data, cfg.task, seed=3)
    items = [data[i] for i in range(40)]
    for i, item in enumerate(items):
        ks, directions = data.plan(i)[:2]
        assert item["template_caption"] == clip_caption([int(data.labels[k]) for k in ks], directions)
    varied = sum(it["caption"] != it["template_caption"] for it in items)
    assert 15 <= varied <= 40                                    # about seven in ten re-worded
    batch = collate(items)
    assert batch["template_caption"] == [it["template_caption"] for it in items]
    assert batch["caption"] == [it["caption"] for it in items]
    drawn = data.render_batch(list(range(8)), torch.device("cpu"))
    assert drawn["template_caption"] == [it["template_caption"] for it in items[:8]]
    assert drawn["caption"] == [it["caption"] for it in items[:8]]


# --- the loss: which captions each model reads, and the weights -----------------------------------

class _Reader(torch.nn.Module):
    """A stand-in text-to-video transformer whose prediction is its input plus scale x the text states."""

    def __init__(self, scale):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(float(scale)))

    def forward(self, hidden_states, timestep=None, encoder_hidden_states=None, return_dict=False):
        shift = encoder_hidden_states.mean(dim=(1, 2))[:, None, None, None, None]
        return (hidden_states + self.scale * shift,)


def _caption_value(caption: str) -> float:
    return float(sum(map(ord, caption)) % 97) / 97.0


def _run(cfg, student_scale=1.0, teacher_scale=1.0):
    read = []

    def text_states(captions, device):
        read.append(list(captions))
        return torch.tensor([_caption_value(c) for c in captions]).view(-1, 1, 1).expand(-1, 2, 3)

    model, teacher = _Reader(student_scale), _Reader(teacher_scale).requires_grad_(False)
    acc = SimpleNamespace(device=torch.device("cpu"), autocast=nullcontext)
    comp = SimpleNamespace(task="text-to-video", teacher=teacher)
    conditioner = SimpleNamespace(latents=lambda pixels, index, device: pixels.to(device), text_states=text_states)
    return Run(cfg, acc, comp, model, model, None, None, Objective(cfg.objective), conditioner), read


def _cfg(*extra):
    return load_config(None, ["output_dir=x", *TINY_WAN, *DISTILL, "objective.class_dropout=0", *extra])


BATCH = {"pixels": torch.rand(3, 1, 2, 4, 4), "index": [0, 1, 2],
         "caption": ["Seven slides right", "the digit 3 moves left", "a handwritten 0 drifting up"],
         "template_caption": ["the digit 7 moves right", "the digit 3 moves left", "the digit 0 moves up"]}


@pytest.mark.parametrize("flow_weight", [0.0, 0.5])
def test_the_teacher_reads_the_template_the_student_the_given_caption(flow_weight):
    cfg = _cfg(f"objective.flow_weight={flow_weight}", "finetune.distill_weight=2.0")
    run, read = _run(cfg, student_scale=1.0, teacher_scale=1.0)
    total, mse, distill = compute_loss(run, dict(BATCH), step=1, positions=[0, 1, 2])
    assert read == [BATCH["caption"], BATCH["template_caption"]]  # student first, then the teacher
    # identical models: the difference is the captions alone, in the two re-worded clips
    gap = torch.tensor([_caption_value(c) - _caption_value(t) for c, t in zip(BATCH["caption"],
                                                                              BATCH["template_caption"])])
    assert gap[1] == 0 and (gap[[0, 2]] != 0).all()
    expected = (gap ** 2).mean()                                # each clip's 2x4x4 values shift alike
    torch.testing.assert_close(distill.detach(), expected)
    torch.testing.assert_close(total.detach(), flow_weight * mse + 2.0 * distill.detach())


def test_teacher_caption_same_reads_the_students_caption():
    cfg = load_config(None, ["output_dir=x", *TINY_WAN, "finetune.mode=convert", "model.pretrained=video-mhla",
                             "model.attention=mhla", "finetune.distill_weight=1.0", "objective.class_dropout=0"])
    run, read = _run(cfg)
    _, _, distill = compute_loss(run, dict(BATCH), step=1, positions=[0, 1, 2])
    assert read == [BATCH["caption"], BATCH["caption"]] and distill.item() == 0.0


def test_without_varied_captions_the_teacher_reads_the_caption():
    run, read = _run(_cfg())
    batch = {k: v for k, v in BATCH.items() if k != "template_caption"}
    compute_loss(run, batch, step=1, positions=[0, 1, 2])
    assert read == [BATCH["caption"], BATCH["caption"]]


def test_dropped_prompts_are_dropped_for_both():
    run, read = _run(_cfg("objective.class_dropout=1.0"))
    _, _, distill = compute_loss(run, dict(BATCH), step=1, positions=[0, 1, 2])
    assert read == [["", "", ""], ["", "", ""]] and distill.item() == 0.0


# --- config errors ---------------------------------------------------------------------------------

@pytest.mark.parametrize("extra, message", [
    (["finetune.teacher_caption=templates"], "finetune.teacher_caption='templates'.*'same', 'template'"),
    (["finetune.teacher_caption=same"], "finetune.distill_weight=1.0 applies only with finetune.mode='convert'"),
    (["finetune.distill_weight=0"], "finetune.teacher_caption='template' needs finetune.distill_weight > 0"),
    (["data.dataset=video-folder", "data.path=/nowhere"], "teacher_caption='template' needs .*moving-mnist"),
    (["objective.flow_weight=-1"], "objective.flow_weight=-1"),
    (["objective.flow_weight=0", "finetune.distill_weight=0", "finetune.teacher_caption=same"],
     "objective.flow_weight=0 with finetune.distill_weight=0 leaves nothing to train"),
])
def test_config_errors_name_the_key_and_what_is_allowed(extra, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["output_dir=x", *TINY_WAN, *DISTILL, *extra])


# --- the shipped config, end to end ---------------------------------------------------------------

def _distill_run(tmp_path, name, *extra):
    out = tmp_path / name
    cfg = load_config(ROOT / "configs/train/wan-mmnist-wordings-distill-mhla.yaml",
                      [f"output_dir={out}", "train.max_steps=2", "train.batch_size=2", "train.mixed_precision=no",
                       "checkpoint.save_pipeline=false", "data.cache_dir=null", "logging.every=1",
                       "objective.class_dropout=0", *extra])
    train(cfg)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_the_wordings_distill_config_starts_at_zero_on_the_template_and_trains_what_reads_the_caption(tmp_path):
    if shipped_checkpoint("video-mhla") is None:
        pytest.skip("the shipped checkpoint video-mhla is not here")
    template = _distill_run(tmp_path, "template", "data.varied_captions=0")
    assert template[0]["distill"] == 0.0                       # the student starts as the teacher
    varied = _distill_run(tmp_path, "varied", "data.varied_captions=1.0")
    assert varied[0]["distill"] > 1e-4 and varied[0]["grad_norm"] > 0
    state = read_model(list_checkpoints(tmp_path / "varied")[-1][1])
    start = load_file(str(shipped_checkpoint("video-mhla") / "transformer" / "diffusion_pytorch_model.safetensors"))
    changed = {k for k in start if not torch.equal(state[k].float(), start[k].float())}
    assert changed and all(("attn2." in k or "norm2" in k or "text_embedder" in k) for k in changed)
    assert any("attn1." in k for k in start) and not any("attn1." in k for k in changed)

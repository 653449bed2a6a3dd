"""Training runs end to end on the CPU: losses fall, checkpoints and pipelines are written, and the
saved pipelines generate through mediagen.pipelines (softmax, MHLA video, LoRA, conversion)."""

import json
import numpy as np
import torch

from mediagen.models.convert import attention_spec_of
from mediagen.pipelines import build_pipeline
from mediagen.training import train
from mediagen.training.checkpoint import list_checkpoints
from training_helpers import TINY_DIT, TINY_WAN, tiny_config


def test_tiny_dit_loss_falls_and_pipeline_generates(tmp_path):
    out = tmp_path / "dit"
    cfg = tiny_config(out, TINY_DIT, "train.max_steps=30", "checkpoint.every=10", "checkpoint.keep_last=2",
                      "optim.ema_decay=0.9", "logging.sample_every=30", "logging.sample_steps=2",
                      "logging.sample_classes=[0,1]", "logging.tensorboard=true")
    losses = train(cfg)["losses"]
    first, last = np.mean([losses[s] for s in range(1, 6)]), np.mean([losses[s] for s in range(26, 31)])
    assert last < 0.6 * first, (first, last)
    assert [s for s, _ in list_checkpoints(out)] == [20, 30]              # keep_last=2
    assert (out / "config.yaml").is_file() and (out / "samples" / "step-0000030" / "class1.png").is_file()
    assert any((out / "tensorboard").iterdir())
    pipe = build_pipeline(str(out / "pipeline"))
    images = pipe(class_labels=[3, 4], num_inference_steps=3, output_type="np",
                  generator=torch.Generator().manual_seed(0)).images
    assert images.shape == (2, 8, 8, 1) and np.isfinite(images).all()
    # the last checkpoint exported equals the final pipeline (both hold the EMA weights of step 30);
    # an earlier one differs
    from safetensors.torch import load_file
    from mediagen.training.export import export_checkpoint
    final = load_file(str(out / "pipeline" / "transformer" / "diffusion_pytorch_model.safetensors"))
    last = export_checkpoint(cfg, "latest")
    assert last.name == "pipeline-step-30"
    exported = load_file(str(last / "transformer" / "diffusion_pytorch_model.safetensors"))
    assert exported.keys() == final.keys() and all(torch.equal(exported[k], final[k]) for k in final)
    earlier = load_file(str(export_checkpoint(cfg, "20", tmp_path / "at20") / "transformer"
                            / "diffusion_pytorch_model.safetensors"))
    assert any(not torch.equal(earlier[k], final[k]) for k in final)
    import pytest
    with pytest.raises(ValueError, match="one of \\[20, 30\\]"):
        export_checkpoint(cfg, "25")


def test_mhla_text_to_video_with_text_cache_generates(tmp_path):
    out = tmp_path / "wan"
    cfg = tiny_config(out, TINY_WAN, "model.attention=mhla", "model.blocks=[1,2,2]", "train.max_steps=4",
                      "train.micro_batch_size=2", "optim.warmup_steps=2", "optim.schedule=cosine",
                      f"data.cache_dir={tmp_path / 'cache'}", "logging.sample_every=4", "logging.sample_steps=2")
    train(cfg)
    assert list((tmp_path / "cache").glob("text-*.safetensors"))
    assert (out / "samples" / "step-0000004" / "prompt0.gif").is_file()
    pipe = build_pipeline(str(out / "pipeline"))
    assert attention_spec_of(pipe.transformer).layers == ["mhla", "mhla"]
    frames = pipe("the digit 3 moves left", height=16, width=16, num_frames=4, num_inference_steps=2).frames
    assert frames.shape == (1, 4, 16, 16, 1)


def test_batches_drawn_on_the_device_train_exactly_like_the_loader(tmp_path):
    losses = {}
    for on_device in (False, True):
        cfg = tiny_config(tmp_path / f"wan-{on_device}", TINY_WAN, "train.max_steps=3", "checkpoint.every=100",
                          "checkpoint.save_pipeline=false", f"data.cache_dir={tmp_path / 'cache'}",
                          f"data.on_device={str(on_device).lower()}")
        losses[on_device] = train(cfg)["losses"]
    assert losses[True] == losses[False] and len(losses[True]) == 3


def test_lora_and_conversion_finetunes(tmp_path):
    base = tmp_path / "base"
    train(tiny_config(base, TINY_DIT, "train.max_steps=3", "checkpoint.every=100"))
    before = build_pipeline(str(base / "pipeline")).transformer.state_dict()

    lora = tmp_path / "lora"
    train(tiny_config(lora, TINY_DIT, "model.preset=null", f"model.pretrained={base / 'pipeline'}",
                      "finetune.mode=lora", "finetune.lora_rank=2", "train.max_steps=3", "optim.lr=1e-2"))
    assert (lora / "lora" / "lora.safetensors").is_file()
    fused = build_pipeline(str(lora / "pipeline")).transformer.state_dict()
    assert not any("lora" in k for k in fused)
    q = "transformer_blocks.0.attn1.to_q.weight"
    assert not torch.equal(fused[q], before[q])                                   # adapters fused in
    assert torch.equal(fused["transformer_blocks.0.ff.net.2.weight"], before["transformer_blocks.0.ff.net.2.weight"])

    conv = tmp_path / "conv"
    result = train(tiny_config(conv, TINY_DIT, "model.preset=null", f"model.pretrained={base / 'pipeline'}",
                               "finetune.mode=convert", "model.attention=mhla", "model.blocks=[2,2]",
                               "finetune.distill_weight=1.0", "train.max_steps=3"))
    assert len(result["losses"]) == 3
    pipe = build_pipeline(str(conv / "pipeline"))
    assert type(pipe.transformer).__name__ == "MHLADiTTransformer2DModel"
    mixes = [p.detach() for n, p in pipe.transformer.named_parameters() if n.endswith("core.mix")]
    assert mixes and all(float(m.min()) >= 0 and float(m.max()) <= 1 for m in mixes)   # Mc clipped
    assert pipe(class_labels=[1], num_inference_steps=2, output_type="np").images.shape == (1, 8, 8, 1)
    # a run continued from a folder does not write that machine-local path into the configs it saves
    for run_dir in (base, lora, conv):
        for config in (run_dir / "pipeline").glob("*/config.json"):
            assert "_name_or_path" not in json.loads(config.read_text()), config


def test_the_lora_file_holds_the_adapters_fused_into_the_pipeline(tmp_path):
    """With EMA the pipeline fuses the EMA adapters; lora/lora.safetensors, the adapters to apply to the base model
    elsewhere, must be the same ones: base weight + (alpha / r) B A from the file gives the pipeline's weight."""
    from safetensors.torch import load_file

    base = tmp_path / "base"
    train(tiny_config(base, TINY_DIT, "train.max_steps=1", "checkpoint.every=100"))
    before = build_pipeline(str(base / "pipeline")).transformer.state_dict()
    lora = tmp_path / "lora"
    train(tiny_config(lora, TINY_DIT, "model.preset=null", f"model.pretrained={base / 'pipeline'}",
                      "finetune.mode=lora", "finetune.lora_rank=2", "finetune.lora_alpha=4", "train.max_steps=4",
                      "optim.lr=1e-2", "optim.ema_decay=0.5", "checkpoint.every=100"))
    fused = build_pipeline(str(lora / "pipeline")).transformer.state_dict()
    adapters = load_file(str(lora / "lora" / "lora.safetensors"))
    for name in ("transformer_blocks.0.attn1.to_q", "transformer_blocks.1.attn1.to_out.0"):
        a, b = adapters[f"{name}.lora_A.weight"], adapters[f"{name}.lora_B.weight"]
        torch.testing.assert_close(fused[f"{name}.weight"], before[f"{name}.weight"] + 2.0 * b @ a)


def test_list_valued_overrides_reach_the_saved_pipeline(tmp_path):
    """A dotlist list (model.overrides.patch_size=[1,2,2], cpe_kernel=[3,1,1]) is an omegaconf
    ListConfig; the run must still save its pipeline, with the values as plain lists."""
    out = tmp_path / "wan"
    train(tiny_config(out, TINY_WAN, "train.max_steps=1", "checkpoint.every=100", "model.overrides.patch_size=[1,2,2]",
                      "model.attention=mhla", "model.blocks=[1,2,2]", "model.attention_options.cpe_kernel=[3,1,1]"))
    config = json.loads((out / "pipeline" / "transformer" / "config.json").read_text())
    assert config["patch_size"] == [1, 2, 2]
    assert config["mediagen_attention"]["cpe_kernel"] == [3, 1, 1]
    assert build_pipeline(str(out / "pipeline")).transformer.config.patch_size == [1, 2, 2]


def test_cpu_runs_bf16_only_where_the_cpu_has_bf16_units(monkeypatch, capsys):
    """bf16 autocast speeds a CPU with bf16 units (AVX512-BF16, AMX) and slows one that emulates it; fp16 has no
    CPU autocast kernels for most ops. What falls back to fp32 says so in one line."""
    from mediagen.training import trainer

    for native in (True, False):
        monkeypatch.setattr(trainer, "native_cpu_bf16", lambda: native)
        assert trainer.cpu_precision("no") == "no"
        assert trainer.cpu_precision("bf16") == ("bf16" if native else "no")
        assert trainer.cpu_precision("fp16") == "no"
    said = capsys.readouterr().out.strip().splitlines()
    assert said == ["train.mixed_precision='fp16': fp16 autocast needs a GPU, so training runs in fp32",
                    "train.mixed_precision='bf16': this CPU has no native bf16, so training runs in fp32",
                    "train.mixed_precision='fp16': fp16 autocast needs a GPU, so training runs in fp32"]
    monkeypatch.setenv("RANK", "1")                                  # another process of a launch: silent
    assert trainer.cpu_precision("fp16") == "no" and capsys.readouterr().out == ""


def test_cpu_runs_of_either_precision_share_one_session(monkeypatch, tmp_path):
    """A bf16 run on a CPU with bf16 units trains in bf16 (its losses differ from fp32's in rounding only), and
    an fp32 run after it in the same Python session still works (accelerate's state allows one precision)."""
    from mediagen.training import trainer

    monkeypatch.setattr(trainer, "native_cpu_bf16", lambda: True)
    runs = {p: train(tiny_config(tmp_path / p, TINY_DIT, "train.max_steps=2", f"train.mixed_precision={p}",
                                 "checkpoint.every=100"))["losses"] for p in ("bf16", "no")}
    bf16, fp32 = (np.array([runs[p][k] for k in sorted(runs[p])]) for p in ("bf16", "no"))
    assert bf16.shape == fp32.shape == (2,) and np.isfinite(bf16).all()
    assert not np.array_equal(bf16, fp32) and np.allclose(bf16, fp32, rtol=0.05)

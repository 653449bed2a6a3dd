"""Configs: unknown keys, wrong types, bad choices and missing data fail at load with clear messages."""

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from mediagen.cli import main as cli_main
from mediagen.training import ConfigError, load_config
from mediagen.training.data import build_dataset

ROOT = Path(__file__).resolve().parents[1]


def write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_unknown_key_names_the_key_and_the_valid_ones(tmp_path):
    p = write(tmp_path, "output_dir: x\nmodel:\n  preset: dit-tiny\n  prest: 3\n")
    with pytest.raises(ConfigError) as err:
        load_config(p)
    assert "model.prest" in str(err.value) and "'preset'" in str(err.value) and "'pretrained'" in str(err.value)
    with pytest.raises(ConfigError, match=r"unknown key 'optimm'.*'optim'"):
        load_config(None, ["output_dir=x", "model.preset=dit-tiny", "optimm.lr=1"])


def test_wrong_type_and_bad_choice(tmp_path):
    p = write(tmp_path, "output_dir: x\nmodel:\n  preset: dit-tiny\ntrain:\n  max_steps: lots\n")
    with pytest.raises(ConfigError, match=r"train\.max_steps.*'lots'"):
        load_config(p)
    with pytest.raises(ConfigError, match=r"objective\.kind='score'.*'flow', 'ddpm'"):
        load_config(None, ["output_dir=x", "model.preset=dit-tiny", "objective.kind=score"])
    with pytest.raises(ConfigError, match="output_dir"):
        load_config(None, ["model.preset=dit-tiny"])
    # a bare `no` is YAML's false: as a dotlist (benchmarks/training_two_gpu.sh) and in a file
    assert load_config(None, ["output_dir=x", "model.preset=dit-tiny", "train.mixed_precision=no"]).train.mixed_precision == "no"
    p = write(tmp_path, "output_dir: x\nmodel:\n  preset: dit-tiny\ntrain:\n  mixed_precision: no\n")
    assert load_config(p).train.mixed_precision == "no"
    with pytest.raises(ConfigError, match=r"train\.mixed_precision='fp8'"):
        load_config(None, ["output_dir=x", "model.preset=dit-tiny", "train.mixed_precision=fp8"])


def test_missing_data_folder_and_inconsistent_settings(tmp_path):
    with pytest.raises(ConfigError, match="data.path is required"):
        load_config(None, ["output_dir=x", "model.preset=wan-tiny", "task=text-to-video", "data.dataset=video-folder"])
    cfg = load_config(None, ["output_dir=x", "model.preset=wan-tiny", "task=text-to-video",
                             "data.dataset=image-folder", f"data.path={tmp_path / 'nope'}"])
    with pytest.raises(ValueError, match=r"data.path=.*nope.* is not a folder"):
        build_dataset(cfg.data, cfg.task)
    with pytest.raises(ConfigError, match="data.on_device=true needs data.dataset='moving-mnist'"):
        load_config(None, ["output_dir=x", "model.preset=dit-tiny", "data.on_device=true"])
    with pytest.raises(ConfigError, match="needs model.pretrained"):
        load_config(None, ["output_dir=x", "model.preset=dit-tiny", "finetune.mode=lora"])


def test_cli_reports_config_errors_without_a_traceback(tmp_path, capsys):
    p = write(tmp_path, "output_dir: x\nmodel:\n  preset: dit-tiny\ndata:\n  datset: mnist\n")
    assert cli_main(["train", str(p)]) == 2
    err = capsys.readouterr().err
    assert "mediagen train: error" in err and "data.datset" in err and "Traceback" not in err


@pytest.mark.parametrize("path", sorted((ROOT / "configs" / "train").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_load(path):
    cfg = load_config(path)
    assert cfg.output_dir.startswith("runs/")


def test_yaml_syntax_error_is_one_line_naming_the_file_and_the_line(tmp_path, capsys):
    p = write(tmp_path, "output_dir: x\nmodel:\n  preset: [dit-tiny\ntrain:\n  max_steps: 3\n")
    assert cli_main(["train", str(p)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"{p}: YAML syntax error at line 4" in err and "line 3, column 11" in err
    p.write_text("- output_dir: x\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: the file holds a list, not a mapping"):
        load_config(p)


def test_errors_say_whether_the_file_or_an_override_gave_the_value(tmp_path, capsys):
    p = write(tmp_path, "output_dir: x\nmodel:\n  preset: dit-tiny\noptim:\n  lr: -0.001\n")
    assert cli_main(["train", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"mediagen train: error: {p}: optim.lr=-0.001 is not allowed: use a number > 0"
    # the override wins, and then it is the one named
    with pytest.raises(ConfigError, match=r"^command-line override: optim\.lr=0\.0 is not allowed"):
        load_config(p, ["optim.lr=0"])
    # a misspelt override is blamed on the command line, not on the file
    assert cli_main(["train", str(p), "optim.lr=1e-3", "optim.lrr=1"]) == 2
    err = capsys.readouterr().err
    assert "command-line override: unknown key 'optim.lrr'" in err and str(p) not in err
    with pytest.raises(ConfigError, match=r"^command-line override: bad value for 'train\.max_steps'.*'many'"):
        load_config(p, ["optim.lr=1e-3", "train.max_steps=many"])
    with pytest.raises(ConfigError, match=r"^command-line override 'optim\.lr' is not KEY=VALUE"):
        load_config(p, ["optim.lr"])
    with pytest.raises(ConfigError, match=r"^command-line override 'optim\.betas=\[0\.9,': the value of 'optim\.betas'"):
        load_config(p, ["optim.betas=[0.9,"])
    # a key the file's own value breaks, checked after the overrides: still the file
    q = write(tmp_path, "output_dir: x\nmodel:\n  preset: dit-tiny\n  attention: mhlaa\n")
    with pytest.raises(ConfigError, match=rf"^{q}: model\.attention='mhlaa' is not allowed: use one of "
                                          r"\['sdpa', 'linear', 'mhla', 'wan-mhla-h'\]"):
        load_config(q, ["train.max_steps=3"])


BASE = ["output_dir=x", "model.preset=dit-tiny"]


@pytest.mark.parametrize("override, message", [
    ("optim.lr=-1e-4", r"optim\.lr=-0\.0001 is not allowed: use a number > 0"),
    ("optim.lr=nan", r"optim\.lr=nan is not allowed"),
    ("optim.betas=[0.9,1.0]", r"optim\.betas=\[0\.9, 1\.0\] is not allowed: use two numbers in \[0, 1\)"),
    ("optim.betas=[0.9]", r"optim\.betas=\[0\.9\] is not allowed"),
    ("optim.weight_decay=-0.1", r"optim\.weight_decay=-0\.1 is not allowed: use a number >= 0"),
    ("optim.eps=0", r"optim\.eps=0\.0 is not allowed: use a number > 0"),
    ("optim.warmup_steps=-1", r"optim\.warmup_steps=-1 is not allowed: use an int >= 0"),
    ("optim.min_lr_ratio=1.5", r"optim\.min_lr_ratio=1\.5 is not allowed: use a number in \[0, 1\]"),
    ("optim.max_grad_norm=-1", r"optim\.max_grad_norm=-1\.0 is not allowed: use a number >= 0"),
    ("optim.ema_decay=1", r"optim\.ema_decay=1\.0 is not allowed: use a number in \[0, 1\)"),
    ("train.micro_batch_size=-2", r"train\.micro_batch_size=-2 is not allowed: use an int >= 0"),
    ("train.batch_size=0", r"train\.batch_size=0 is not allowed: use an int >= 1"),
    ("train.time_limit_minutes=-1", r"train\.time_limit_minutes=-1\.0 is not allowed"),
    ("checkpoint.every=0", r"checkpoint\.every=0 is not allowed: use an int >= 1"),
    ("logging.every=0", r"logging\.every=0 is not allowed"),
    ("objective.class_dropout=1.5", r"objective\.class_dropout=1\.5 is not allowed: use a probability"),
    ("objective.size_weighting=-1", r"objective\.size_weighting=-1\.0 is not allowed: use a number in \[0, 2\]"),
    ("data.num_workers=-1", r"data\.num_workers=-1 is not allowed"),
    ("model.attention=[mhla,softmax]", r"model\.attention\[1\]='softmax' is not allowed: each entry is one of "
                                       r"\['sdpa', 'linear', 'mhla'\] or null"),
    ("model.attention=3", r"model\.attention=3 is not allowed"),
    ("train.seed=-1", r"train\.seed=-1 is not allowed: use an int in \[0, 4294967295\]"),
    ("train.seed=4294967296", r"train\.seed=4294967296 is not allowed"),
    ("objective.logit_mean=nan", r"objective\.logit_mean=nan is not allowed: use a finite number"),
    ("logging.guidance_scale=nan", r"logging\.guidance_scale=nan is not allowed: use a number >= 0"),
    ("logging.guidance_scale=-2", r"logging\.guidance_scale=-2\.0 is not allowed: use a number >= 0"),
    ("data.split=validation", r"data\.split='validation' is not allowed: use one of \['train', 'held_out', 'all'\]"),
    ("logging.sample_classes=[-1]", r"logging\.sample_classes=\[-1\] is not allowed: use class indices >= 0"),
    # a negative floor drives the cosine schedule's learning rate below zero
    ("optim.min_lr_ratio=-0.5", r"optim\.min_lr_ratio=-0\.5 is not allowed: use a number in \[0, 1\]"),
    # an infinite decay turns every weight into -inf on the first step
    ("optim.weight_decay=inf", r"optim\.weight_decay=inf is not allowed: use a number >= 0"),
    # a run of no steps trains nothing
    ("train.max_steps=0", r"train\.max_steps=0 is not allowed: use an int >= 1"),
    # a spread of 0 trains at one noise level; a shift of 0 maps every noise level to clean data
    ("objective.logit_std=0", r"objective\.logit_std=0\.0 is not allowed: use a number > 0"),
    ("objective.shift=0", r"objective\.shift=0\.0 is not allowed: use a number > 0"),
    ("objective.size_weighting=2.5", r"objective\.size_weighting=2\.5 is not allowed: use a number in \[0, 2\]"),
    ("finetune.lora_rank=0", r"finetune\.lora_rank=0 is not allowed: use an int >= 1"),
    # AdamW reads the first two betas and ignores the rest, so a third would be dropped without a word
    ("optim.betas=[0.9,0.99,0.9]", r"optim\.betas=\[0\.9, 0\.99, 0\.9\] is not allowed: use two numbers"),
    # the shift by token count takes the log of max_shift
    ("objective.max_shift=0", r"objective\.max_shift=0\.0 is not allowed: use a number > 0"),
])
def test_values_out_of_range_fail_at_load_naming_key_value_and_source(override, message):
    with pytest.raises(ConfigError, match=r"^command-line override: " + message):
        load_config(None, [*BASE, override])


@pytest.mark.parametrize("lens", ["[256,256]", "[0,256]", "[512,256]"])
def test_shift_token_counts_must_rise_from_above_zero(lens):
    """With objective.max_shift the log of the shift is a line between shift_seq_len[0] and [1] tokens:
    equal counts divide by zero and a count of 0 tokens names no clip, so both are refused at load
    naming the key."""
    with pytest.raises(ConfigError, match=r"^command-line override: objective\.shift_seq_len=\[\d+, \d+\] is not "
                                          r"allowed: use two token counts \[low, high\] with 0 < low < high"):
        load_config(None, [*BASE, "objective.max_shift=6", f"objective.shift_seq_len={lens}"])
    assert list(load_config(None, [*BASE, "objective.max_shift=6", "objective.shift_seq_len=[255,256]"])
                .objective.shift_seq_len) == [255, 256]


# values at the closed ends of the allowed ranges, several of which the config documents as a setting of
# its own (0: keep every checkpoint, no warm-up, no samples, no clipping, ...): they must load as given
@pytest.mark.parametrize("override", [
    "checkpoint.keep_last=0", "optim.warmup_steps=0", "optim.min_lr_ratio=0", "optim.min_lr_ratio=1",
    "optim.ema_decay=0", "optim.max_grad_norm=0", "objective.class_dropout=1", "objective.size_weighting=2",
    "train.seed=4294967295", "train.micro_batch_size=0", "logging.sample_every=0", "data.num_workers=0",
    "train.max_steps=1", "finetune.lora_rank=1",
])
def test_values_at_the_ends_of_the_allowed_ranges_load(override):
    key, value = override.split("=")
    assert OmegaConf.select(load_config(None, [*BASE, override]), key) == float(value)


def test_a_run_failing_on_its_config_leaves_the_runs_config_yaml_alone(tmp_path, capsys):
    """config.yaml is written once the dataset, model and optimizer are built: a run that fails before
    (on a config check, a missing data folder, an attention the converter refuses, an optimizer
    setting torch refuses) leaves the existing run's file as it was, whether it resumes that run or was
    asked to start it over (overwrite_output_dir=true deletes the earlier run only once all is built)."""
    from mediagen.training import train
    from training_helpers import TINY_DIT, TINY_WAN, tiny_config

    out = tmp_path / "run"
    out.mkdir()
    saved = out / "config.yaml"
    saved.write_text("the existing run's config\n")
    assert cli_main(["train", str(write(tmp_path, f"output_dir: {out}\n")), *TINY_DIT, "optim.lr=-1",
                     "checkpoint.resume=latest"]) == 2
    assert "optim.lr=-1.0 is not allowed" in capsys.readouterr().err
    for again in ("checkpoint.resume=latest", "overwrite_output_dir=true"):
        no_data = tiny_config(out, TINY_WAN, "data.dataset=video-folder", f"data.path={tmp_path / 'nope'}", again)
        with pytest.raises(ValueError, match="is not a folder"):
            train(no_data)
        for key, bad, error in (("model.attention", "softmax", "attention='softmax' is not allowed"),
                                ("optim.lr", -1.0, "Invalid learning rate")):
            cfg = tiny_config(out, TINY_DIT, "train.max_steps=1", again)
            OmegaConf.update(cfg, key, bad)   # past load_config's checks, as a caller of train() may do
            with pytest.raises(ValueError, match=error):
                train(cfg)
    assert saved.read_text() == "the existing run's config\n"
    assert not (out / "metrics.jsonl").exists()
    train(tiny_config(out, TINY_DIT, "train.max_steps=1", "checkpoint.save_pipeline=false",
                      "checkpoint.resume=latest"))
    assert OmegaConf.load(saved).train.max_steps == 1


def test_size_weighting_weighs_a_batch_by_its_clips_pixels_against_the_configured_size():
    from mediagen.training.trainer import size_weight

    cfg = load_config(None, ["output_dir=x", "model.preset=wan-mmnist", "task=text-to-video", "data.dataset=moving-mnist", "data.resolution=128",
                             "data.num_frames=32", "objective.size_weighting=1"])
    long, short = torch.zeros(2, 1, 32, 128, 128), torch.zeros(2, 1, 16, 64, 64)
    assert size_weight(cfg, {"pixels": long}) == 1.0
    assert size_weight(cfg, {"pixels": short}) == 1 / 8           # a pixel of either size weighs the same
    cfg.objective.size_weighting = 0.5
    assert size_weight(cfg, {"pixels": short}) == pytest.approx(8 ** -0.5)
    cfg.objective.size_weighting = 0.0
    assert size_weight(cfg, {"pixels": short}) == 1.0              # off: a batch's mean loss as it is
    cfg.objective.size_weighting = 1.0
    with pytest.raises(ConfigError, match=r"objective\.size_weighting=1\.0 is not allowed with data\.dataset="):
        size_weight(cfg, {"latents": short})


def test_size_weighting_with_encoded_clips_fails_at_load():
    with pytest.raises(ConfigError, match=r"objective\.size_weighting=1\.0 is not allowed with "
                                          r"data\.dataset='latent-cache'"):
        load_config(None, [*BASE, "task=text-to-video", "data.dataset=latent-cache", "data.cache_dir=x",
                           "objective.size_weighting=1"])


def test_sample_classes_the_model_lacks_fail_before_training(tmp_path):
    """logging.sample_classes are drawn at the first sample step; a class the model has no label for (dit-tiny has
    10) is named at start, before any step trains or writes output_dir, not by the pipeline once a run is under way
    (sampling comes before that step's checkpoint)."""
    from mediagen.training import train

    out = tmp_path / "run"
    cfg = load_config(None, [f"output_dir={out}", "model.preset=dit-tiny", "data.resolution=8", "train.batch_size=4",
                             "train.max_steps=2", "logging.progress=false", "logging.tensorboard=false",
                             "logging.sample_every=1", "logging.sample_steps=1", "logging.sample_classes=[3,12]"])
    with pytest.raises(ConfigError, match=r"logging\.sample_classes=\[3, 12\] is not allowed: .*0 to 9"):
        train(cfg)
    assert not (out / "metrics.jsonl").exists()


def test_data_channels_the_model_does_not_take_fail_before_training(tmp_path):
    """data.channels must be the pixel channels the model reads (dit-tiny in pixel space: 1). An RGB dataset for a
    grey model is named in one line at start, not by a convolution's shape error in the first step."""
    from mediagen.training import train

    out = tmp_path / "run"
    cfg = load_config(None, [f"output_dir={out}", "model.preset=dit-tiny", "data.resolution=8", "train.batch_size=4",
                             "train.max_steps=1", "logging.progress=false", "logging.tensorboard=false",
                             "data.channels=3"])
    with pytest.raises(ConfigError, match=r"data\.channels=3 is not allowed: .*1 channel"):
        train(cfg)
    assert not (out / "metrics.jsonl").exists()


def test_model_overrides_the_model_does_not_take_fail_in_one_line(tmp_path):
    """model.overrides change a preset's config: a key the preset's class does not take is named with the keys it
    does (not a TypeError traceback), a count below 1 is named (not an IndexError in the first step), and overrides
    beside model.pretrained, which would be dropped, are refused."""
    from mediagen.training.components import build_components

    cfg = load_config(None, ["output_dir=x", "model.preset=dit-tiny", "model.overrides.num_layer=2"])
    with pytest.raises(ConfigError, match=r"model\.overrides\.num_layer=2 is not allowed: .*'num_layers'"):
        build_components(cfg)
    for key in ("num_layers", "attention_head_dim"):
        cfg = load_config(None, ["output_dir=x", "model.preset=dit-tiny", f"model.overrides.{key}=0"])
        with pytest.raises(ConfigError, match=rf"model\.overrides\.{key}=0 is not allowed: use an int >= 1"):
            build_components(cfg)
    with pytest.raises(ConfigError, match=r"model\.overrides=\{'num_layers': 2\} is not allowed with "
                                          r"model\.pretrained='image-mhla'"):
        load_config(None, ["output_dir=x", "model.pretrained=image-mhla", "finetune.mode=full",
                           "model.overrides.num_layers=2"])

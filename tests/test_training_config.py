"""Configs: unknown keys, wrong types, bad choices and missing data fail at load with clear messages."""

from pathlib import Path

import pytest

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

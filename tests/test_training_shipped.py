"""Fine-tuning the shipped checkpoints: `mediagen train` takes their names as model.pretrained (as
generate and fid do), a text model keeps the text encoder it was trained with unless another is asked
for, and captioned images are pointed at the text-conditioned models."""

import json

import pytest
import torch

from mediagen.cli import main as cli_main
from mediagen.models.byte_text_encoder import ByteTextEncoder
from mediagen.pipelines.shipping import referenced_text_encoder, shipped_checkpoint
from mediagen.training import ConfigError
from mediagen.training.components import build_components
from training_helpers import tiny_config

VIDEO = ["task=text-to-video", "model.pretrained=video-mhla", "finetune.mode=full", "data.dataset=moving-mnist"]


def needs(name):
    if shipped_checkpoint(name) is None:
        pytest.skip(f"the shipped checkpoint {name} is not here")


def test_a_shipped_text_model_keeps_the_encoder_it_was_trained_with(tmp_path):
    """video-mhla names MiniLM in text_encoder_ref.json: an unset model.text_encoder gives that encoder
    (the same weights the pipeline loads), not a new random byte encoder, whose states read as noise
    to the model (step-1 loss 0.117 against 0.016); model.text_encoder=byte still gives one on request."""
    needs("video-mhla")
    comp = build_components(tiny_config(tmp_path / "run", VIDEO))
    shipped = referenced_text_encoder(shipped_checkpoint("video-mhla"))["text_encoder"]
    assert not isinstance(comp.text_encoder, ByteTextEncoder) and comp.text_encoder_name == "minilm"
    assert type(comp.text_encoder) is type(shipped) and comp.tokenizer is not None
    own, ref = comp.text_encoder.state_dict(), shipped.state_dict()
    assert own.keys() == ref.keys() and all(torch.equal(own[k], ref[k]) for k in ref)
    asked = build_components(tiny_config(tmp_path / "run", VIDEO, "model.text_encoder=byte"))
    assert isinstance(asked.text_encoder, ByteTextEncoder) and asked.text_encoder_name == "byte"
    with pytest.raises(ValueError, match="model.text_encoder='pipeline' needs model.pretrained"):
        build_components(tiny_config(tmp_path / "run", ["task=text-to-video", "model.preset=wan-tiny",
                                                        "model.text_encoder=pipeline"]))


def test_train_takes_a_shipped_name_as_model_pretrained(tmp_path, capsys):
    needs("image-mhla")
    config = tmp_path / "empty.yaml"
    config.write_text("{}\n")
    out = tmp_path / "run"
    rc = cli_main(["train", str(config), f"output_dir={out}", "model.pretrained=image-mhla", "finetune.mode=full",
                   "data.resolution=28", "train.batch_size=2", "train.max_steps=1", "checkpoint.save_pipeline=false",
                   "logging.progress=false", "logging.tensorboard=false"])
    assert rc == 0, capsys.readouterr().err
    assert json.loads((out / "metrics.jsonl").read_text())["step"] == 1
    # a name that is neither a folder nor shipped: the message lists the shipped ones
    rc = cli_main(["train", str(config), f"output_dir={tmp_path / 'other'}", "model.pretrained=image-mhlx",
                   "finetune.mode=full", "train.max_steps=1"])
    err = capsys.readouterr().err
    assert rc == 2 and "model.pretrained='image-mhlx' is neither a folder nor a shipped checkpoint" in err
    assert "'image-mhla'" in err and "'video-mhla'" in err


def test_captioned_images_are_pointed_at_the_text_models(tmp_path):
    """The class-conditional image models take digit labels: with captioned images the config check (for
    task=class-to-image) or the model check (text-to-image on a DiT) says which shipped model fits."""
    needs("image-mhla")
    (tmp_path / "images").mkdir()
    folder = ["data.dataset=image-folder", f"data.path={tmp_path / 'images'}"]
    with pytest.raises(ConfigError, match=r"data.dataset='image-folder' has captions, not class labels.*"
                                          r"task=text-to-image with model.pretrained=video-mhla"):
        tiny_config(tmp_path / "run", ["model.pretrained=image-mhla", "task=class-to-image", *folder])
    cfg = tiny_config(tmp_path / "run", ["model.pretrained=image-mhla", "task=text-to-image", *folder])
    with pytest.raises(ValueError, match=r"task='text-to-image' does not fit a class-conditional \(DiT\) transformer "
                                         r".*model.pretrained='image-mhla'.*model.pretrained=video-mhla"):
        build_components(cfg)

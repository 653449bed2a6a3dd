"""Shipped models are resolved in one place (mediagen.pipelines.catalog), from the checkpoint folders and their
card.json: which attentions a family has, which checkpoint is the default for a task, which text encoder a label
loads. `mediagen generate` and the app read the same answers."""

import json

import pytest

from mediagen.pipelines import catalog


def _checkpoint(root, name, card=None, marker="model_index.json"):
    (root / name).mkdir(parents=True)
    (root / name / marker).write_text("{}")
    if card is not None:
        (root / name / "card.json").write_text(card if isinstance(card, str) else json.dumps(card))


def test_the_shipped_cards_name_one_default_per_task():
    assert catalog.default_checkpoint("class-to-image") == "image-mhla"
    assert catalog.default_checkpoint("text-to-video") == "video-mhla"
    assert catalog.default_checkpoint("text-to-image") == "video-sdpa"
    assert catalog.trained_attentions("image") == ["sdpa", "mhla", "linear"]
    assert catalog.trained_attentions("video") == ["sdpa", "mhla"]
    assert catalog.family_of("video-sdpa") == "video" and catalog.family_of("dit-mnist") is None
    assert catalog.family_of("video-hybrid") is None                  # no such checkpoint is shipped
    assert catalog.shipped_names() == ["image-sdpa", "image-mhla", "image-linear", "video-sdpa", "video-mhla"]


def test_the_default_follows_the_cards(tmp_path):
    _checkpoint(tmp_path, "image-sdpa", {"default_for": ["class-to-image"]})
    _checkpoint(tmp_path, "image-mhla", {"trained_steps": 10})
    _checkpoint(tmp_path, "video-mhla", {"default_for": "text-to-video"}, marker="config.json")   # a transformer
    _checkpoint(tmp_path, "video-sdpa", "{not json")
    assert catalog.default_checkpoint("class-to-image", tmp_path) == "image-sdpa"
    assert catalog.defaults("video", tmp_path) == {"text-to-video": "mhla"}   # no card names text-to-image
    assert catalog.default_checkpoint("text-to-image", tmp_path) is None
    assert catalog.checkpoint("video", "mhla", tmp_path) == tmp_path / "video-mhla"
    assert catalog.checkpoint("video", "linear", tmp_path) is None
    (tmp_path / "image-mhla" / "card.json").write_text(json.dumps({"default_for": ["class-to-image"]}))
    with pytest.raises(ValueError, match=r"\['image-sdpa', 'image-mhla'\] all name 'class-to-image'"):
        catalog.default_checkpoint("class-to-image", tmp_path)
    with pytest.raises(ValueError, match="task='text-to-audio' is not allowed"):
        catalog.default_checkpoint("text-to-audio", tmp_path)


def test_the_command_line_and_the_app_start_on_the_same_checkpoint(tmp_path, monkeypatch):
    """Both read the cards: moving "default_for" to another card moves the CLI's default model and the app's
    first choice together; with no card naming a task, the CLI takes the preset and the app its first choice."""
    from mediagen.app.models import default_models
    from mediagen.pipelines.generate_cli import _default_model

    monkeypatch.setenv("MEDIAGEN_CHECKPOINTS", str(tmp_path))
    _checkpoint(tmp_path, "image-sdpa")
    _checkpoint(tmp_path, "image-linear", {"default_for": ["class-to-image"]})
    _checkpoint(tmp_path, "video-sdpa")
    _checkpoint(tmp_path, "video-mhla", {"default_for": ["text-to-image"]})
    models = default_models()
    assert _default_model(None) == "image-linear" and models.first_choice("class-to-image") == "linear"
    assert _default_model("text-to-image") == "video-mhla" and models.first_choice("text-to-image") == "mhla"
    assert _default_model("text-to-video") == "wan-mmnist" and models.first_choice("text-to-video") == "sdpa"


def test_text_encoder_labels_load_the_distilled_encoders_when_shipped(tmp_path):
    assert catalog.text_encoders(tmp_path) == {"FlashAttention": "minilm", "MLRA": "minilm-mlra2",
                                               "HLA": "minilm-hla"}
    _checkpoint(tmp_path, "text-mlra", marker="config.json")
    assert catalog.text_encoders(tmp_path)["MLRA"] == str(tmp_path / "text-mlra")


def test_card_lines():
    card = {"trained_steps": 11223, "clips_seen": 2873088, "scores": {"digit": 0.965, "direction": 1.0},
            "measured_on": "400 clips", "note": "a note", "default_for": ["text-to-video"]}
    assert catalog.card_line(card) == "11,223 training steps; digit 0.965, direction 1.0"
    assert catalog.card_details(card) == "- training: 2,873,088 clips seen\n- scores measured on: 400 clips\n- a note"
    assert catalog.card_line({}) == "trained (steps not recorded); scores: not measured"

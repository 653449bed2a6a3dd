"""Prompt rewriting to a model's caption template: the function, the pipeline's default (its config, as the
shipped cards declare it), ``mediagen generate --rewrite-prompt/--no-rewrite-prompt`` and ``mediagen vbench``."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from mediagen.data.captions import CAPTION_TEMPLATE
from mediagen.pipelines.prompts import rewrite_prompt


@pytest.mark.parametrize("prompt, want", [
    ("watch the digit three travel left", "the digit 3 moves left"),
    ("One glides left", "the digit 1 moves left"),
    ("can you make the number 3 go left?", "the digit 3 moves left"),
    ("the 7 slides to the left", "the digit 7 moves left"),
    ("a handwritten nine drifting upwards.", "the digit 9 moves up"),
    ("RIGHTWARD MOTION OF THE DIGIT 0", "the digit 0 moves right"),
    ("watch the digit 3 travel left as the digit eight travels down",
     "the digit 3 moves left while the digit 8 moves down"),
    ("the digits 4 and 5 both move right", "the digit 4 moves right while the digit 5 moves right"),
    # directions named by verbs, compass points and the canvas's edges; "from" names where a digit starts
    ("an eight falling", "the digit 8 moves down"),
    ("a 2 rising slowly", "the digit 2 moves up"),
    ("9 ascending", "the digit 9 moves up"),
    ("a handwritten 2 sinking", "the digit 2 moves down"),
    ("a six travelling west", "the digit 6 moves left"),
    ("the digit 4 moving eastward", "the digit 4 moves right"),
    ("the digit 5 moves toward the top", "the digit 5 moves up"),
    ("show me the number nine moving from right to left", "the digit 9 moves left"),
    ("the digit 0 moving from left to right", "the digit 0 moves right"),
    ("a 3 sliding in from the left", "the digit 3 moves right"),
    ("the digit 3 travels right-to-left", "the digit 3 moves left"),
    ("a 4 moving top to bottom", "the digit 4 moves down"),
    ("a 9 falling from the top", "the digit 9 moves down"),
    ("the 6 at the top moves left", "the digit 6 moves left"),     # where it is, not which way
    ("one 7 moving right", "the digit 7 moves right"),              # a count before a numeral
    ("a nought plummeting", "the digit 0 moves down"),
    ("a picture of a seven", "the digit 7"),                        # a still prompt: the still template
    ("the number six on a dark screen", "the digit 6"),
])
def test_wordings_are_rewritten_to_the_training_template(prompt, want):
    assert rewrite_prompt(prompt) == (want, f"read as: {want}")


@pytest.mark.parametrize("prompt, why", [
    ("a cat playing piano", "it names no digit"),
    ("the number 12 moves left", "it names 12, and the models read the digits 0-9 only"),
    ("twenty goes up", "it names twenty"),
    ("the digits 1, 2 and 3 move left", "it names 3 digits, and the model was trained on two digits a clip"),
    ("two digits, a 3, moving left", "it asks for 2 digits and names 1"),
])
def test_a_prompt_the_parser_cannot_read_is_left_unchanged(prompt, why):
    rewritten, reason = rewrite_prompt(prompt)
    assert rewritten == prompt and reason.startswith(f"left as written: {why}")


def test_more_digits_than_the_model_was_trained_on_are_left_unchanged():
    two = "the 3 goes left and the 8 goes down"
    assert rewrite_prompt(two, max_digits=2)[0] == "the digit 3 moves left while the digit 8 moves down"
    assert rewrite_prompt(two, max_digits=1) == (
        two, "left as written: it names 2 digits, and the model was trained on one digit a clip")
    assert rewrite_prompt("the digit 3 moves left") == ("the digit 3 moves left",
                                                        "as written: already the model's caption template")
    with pytest.raises(ValueError, match="is not a template this package renders"):
        rewrite_prompt("the digit 3 moves left", "a {d} going {m}")


def test_every_training_and_held_out_wording_rewrites_to_the_template_the_data_captions_with():
    """The rewriting reads the varied training wordings and the held-out ones back to exactly the caption the
    training data gives the same clip (``clip_caption``), so a rewritten prompt is a training caption."""
    from mediagen.training.data.moving_mnist import clip_caption
    from mediagen.training.data.wordings import DIRECTION_PHRASES, STILL, held_out_caption, held_out_grid, varied_caption

    rng, draw = np.random.default_rng(0), np.random.default_rng(1)
    for _ in range(500):
        n = 1 + int(draw.random() < 0.5)
        digits = [int(x) for x in draw.integers(10, size=n)]
        moves = ([STILL] * n if draw.random() < 0.1
                 else [list(DIRECTION_PHRASES)[int(k)] for k in draw.integers(4, size=n)])
        caption = varied_caption(digits, moves, rng)
        assert rewrite_prompt(caption)[0] == clip_caption(digits, moves), caption
    captions, ds, ms = held_out_grid()
    for caption, d, m in zip(captions, ds, ms):
        assert rewrite_prompt(caption, max_digits=1)[0] == clip_caption([d], [m]), caption
    assert rewrite_prompt(held_out_caption([3, 8], ["left", "down"], 1))[0] == clip_caption([3, 8], ["left", "down"])


# --- the pipeline: its config says whether prompts are rewritten --------------------------------------

def _tiny_pipeline(template=CAPTION_TEMPLATE, digits=1):
    from mediagen.models.presets import build_transformer
    from mediagen.pipelines.building import pipeline_around
    from mediagen.pipelines.schedulers import make_scheduler

    torch.manual_seed(0)
    pipe = pipeline_around(build_transformer("wan-tiny"), make_scheduler("flow-euler"))
    pipe.register_to_config(caption_template=template, caption_digits=digits)
    return pipe


def _encoded(pipe, monkeypatch) -> list:
    """The prompts ``pipe`` hands its text encoder, call by call."""
    seen, encode = [], pipe.encode_prompt

    def spy(prompt=None, *args, **kwargs):
        seen.append(prompt)
        return encode(prompt, *args, **kwargs)

    monkeypatch.setattr(pipe, "encode_prompt", spy)
    return seen


def test_the_pipeline_rewrites_by_its_config_and_keeps_the_prompt_when_told(monkeypatch):
    pipe = _tiny_pipeline()
    seen = _encoded(pipe, monkeypatch)
    common = dict(height=8, width=8, num_frames=3, num_inference_steps=1, guidance_scale=1.0, output_type="latent")
    pipe(prompt=["watch the digit three travel left", "a cat"], **common)
    pipe(prompt="watch the digit three travel left", rewrite_prompt=False, **common)
    assert seen == [["the digit 3 moves left", "a cat"], ["watch the digit three travel left"]]   # "a cat": unread
    assert pipe.prompt_for_model("One glides left") == ("the digit 1 moves left", "read as: the digit 1 moves left")

    plain = _tiny_pipeline(template=None, digits=None)               # trained on free wording: as written
    seen = _encoded(plain, monkeypatch)
    plain(prompt="One glides left", **common)
    assert seen == [["One glides left"]]
    with pytest.raises(ValueError, match="rewrite_prompt=True needs a pipeline with a caption_template"):
        plain(prompt="One glides left", rewrite_prompt=True, **common)


def test_the_template_travels_with_the_saved_pipeline(tmp_path):
    from mediagen.pipelines.text_video import TextToVideoPipeline

    pipe = _tiny_pipeline()
    pipe.save_pretrained(tmp_path / "pipe")
    saved = json.loads((tmp_path / "pipe" / "model_index.json").read_text())
    assert (saved["caption_template"], saved["caption_digits"]) == (CAPTION_TEMPLATE, 1)
    loaded = TextToVideoPipeline.from_pretrained(str(tmp_path / "pipe"))
    assert (loaded.config.caption_template, loaded.config.caption_digits) == (CAPTION_TEMPLATE, 1)
    with pytest.raises(ValueError, match="is not a template this package renders"):
        TextToVideoPipeline(**pipe.components, caption_template="a {d} going {m}")


def test_shipped_video_models_declare_their_template_on_the_card_and_in_the_pipeline():
    """The card says whether a model wants rewriting; its pipeline's model_index.json carries the same template
    and the card's trained digits, so a plain ``from_pretrained`` rewrites as the app and the CLI do."""
    from mediagen.pipelines import catalog

    folders = catalog.checkpoints("video")
    if not folders:
        pytest.skip("no shipped video checkpoints in this checkout")
    for label, folder in folders.items():
        card = catalog.read_card(folder)
        index = json.loads((folder / "model_index.json").read_text())
        assert catalog.caption_template(card) == index.get("caption_template") == CAPTION_TEMPLATE, label
        assert index.get("caption_digits") == card["trained_on"]["digits"], label


# --- the command lines -----------------------------------------------------------------------------

def test_generate_rewrites_by_default_and_says_so_and_keeps_the_prompt_when_told(tmp_path, monkeypatch, capsys):
    from mediagen.cli import main
    from mediagen.pipelines import building

    pipe = _tiny_pipeline()
    seen = _encoded(pipe, monkeypatch)
    monkeypatch.setattr(building, "build_pipeline", lambda *a, **k: pipe)
    common = ["generate", "--model", "wan-tiny", "--task", "text-to-video", "--prompt", "One glides left",
              "--steps", "1", "--frames", "3", "--height", "8", "--width", "8", "--guidance", "1"]
    assert main(common + ["--out", str(tmp_path / "a.mp4")]) == 0
    assert "prompt read as: the digit 1 moves left" in capsys.readouterr().err
    assert main(common + ["--no-rewrite-prompt", "--out", str(tmp_path / "b.mp4")]) == 0
    assert "read as" not in capsys.readouterr().err
    assert seen == [["the digit 1 moves left"], ["One glides left"]]
    monkeypatch.undo()
    assert main(["generate", "--model", "dit-tiny", "--class-label", "3", "--rewrite-prompt", "--out",
                 str(tmp_path / "c.png")]) != 0
    assert "--rewrite-prompt / --no-rewrite-prompt is for text models" in capsys.readouterr().err


@pytest.mark.parametrize("flag, want", [([], None), (["--no-rewrite-prompt"], False), (["--rewrite-prompt"], True)])
def test_vbench_samples_as_the_pipeline_says_unless_told(tmp_path, monkeypatch, flag, want):
    """``mediagen vbench --checkpoint`` leaves rewriting to the pipeline (on for the shipped video models, as a
    user gets them); --no-rewrite-prompt measures the raw model. Clips are scored against the prompts as given."""
    from mediagen.cli import main
    from mediagen.eval import sampling

    asked = {}

    def fake_sample(checkpoint, prompts, seed, device, **kwargs):
        asked.update(kwargs)
        return [np.zeros((3, 8, 8, 3), np.uint8) for _ in prompts]

    monkeypatch.setattr(sampling, "sample_videos", fake_sample)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("One glides left\n")
    out = tmp_path / "r.json"
    assert main(["vbench", "--checkpoint", "video-mhla", "--prompts", str(prompts), "--subject-features", "pixels",
                 "--background-features", "mnist", "--quiet", "--out", str(out), *flag]) == 0
    assert asked["rewrite_prompt"] is want
    assert json.loads(out.read_text())["per_video"][0]["prompt"] == "One glides left"

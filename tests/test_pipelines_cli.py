"""``mediagen generate`` in-process on tiny presets: writes PNG / MP4 / GIF and prints the paths."""

import imageio.v3 as iio
import numpy as np
from PIL import Image

from mediagen.cli import main


def test_generate_class_image_png(tmp_path, capsys):
    out = tmp_path / "digit.png"
    assert main(["generate", "--model", "dit-tiny", "--class-label", "3", "--steps", "2", "--attention", "mhla",
                 "--scheduler", "ddim", "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(out)
    assert Image.open(out).size == (8, 8)


def test_generate_video_mp4_and_gif(tmp_path, capsys):
    mp4, gif = tmp_path / "clip.mp4", tmp_path / "clip.gif"
    common = ["generate", "--model", "wan-tiny", "--prompt", "a digit", "--steps", "2", "--frames", "3",
              "--height", "8", "--width", "12"]
    assert main(common + ["--attention", "wan-mhla-h", "--out", str(mp4)]) == 0
    assert main(common + ["--attention", "linear", "--scheduler", "flow-unipc", "--out", str(gif)]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert str(mp4) in printed and str(gif) in printed
    frames = iio.imread(mp4, plugin="pyav")
    assert frames.shape[0] == 3 and frames.shape[1:3] == (8, 12)
    assert Image.open(gif).n_frames == 3


def test_generate_from_saved_transformer_folder(tmp_path, capsys):
    import mediagen
    from mediagen.models import build_transformer

    model = mediagen.convert(build_transformer("wan-tiny"), "mhla", blocks=[1, 2, 2])
    model.save_pretrained(tmp_path / "ckpt")
    out = tmp_path / "still.png"
    assert main(["generate", "--model", str(tmp_path / "ckpt"), "--task", "text-to-image", "--prompt", "x",
                 "--steps", "1", "--height", "8", "--width", "8", "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(out)
    assert np.asarray(Image.open(out)).shape[:2] == (8, 8)


def test_generate_bad_input_is_a_readable_error(tmp_path, capsys):
    assert main(["generate", "--model", "wan-tiny", "--prompt", "x", "--height", "9", "--out",
                 str(tmp_path / "a.mp4")]) == 2
    assert "--height 9 is not allowed: it must be a positive multiple of" in capsys.readouterr().err  # the flag
    tiny = ["generate", "--model", "wan-tiny", "--prompt", "x", "--steps", "1", "--frames", "3", "--height", "8",
            "--width", "8"]
    assert main(tiny + ["--width", "5", "--out", str(tmp_path / "a.mp4")]) == 2
    assert "--width 5 is not allowed: it must be a positive multiple of" in capsys.readouterr().err
    assert main(["generate", "--model", "dit-tiny", "--steps", "1", "--height", "16", "--width", "8", "--out",
                 str(tmp_path / "a.png")]) == 2
    assert "--height 16 and --width 8 must be equal" in capsys.readouterr().err
    # --blocks and --shift still take effect where they can: a conversion of a preset, a preset's flow scheduler
    assert main(tiny + ["--attention", "mhla", "--blocks", "1,2,2", "--shift", "2", "--fps", "4", "--seed",
                        "2147483647", "--guidance", "0", "--out", str(tmp_path / "ok.mp4")]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(tmp_path / "ok.mp4")
    assert main(["generate", "--model", "dit-tiny", "--prompt", "x", "--out", str(tmp_path / "a.png")]) == 2
    assert "--class-label" in capsys.readouterr().err
    assert main(["generate", "--model", "nope", "--out", str(tmp_path / "a.png")]) == 2
    err = capsys.readouterr().err
    assert "model='nope'" in err and "a shipped checkpoint (image-sdpa, image-mhla" in err and "video-mhla" in err
    assert main(["generate", "--model", "dit-tiny", "--out", str(tmp_path / "a.mp4")]) == 2
    assert "png" in capsys.readouterr().err


def test_generate_refuses_a_bad_suffix_before_building(tmp_path, capsys, monkeypatch):
    """A suffix no task writes, or one the asked --task does not, is refused before any model is built."""
    from mediagen.pipelines import building

    def no_build(*args, **kwargs):
        raise AssertionError("a pipeline was built")

    monkeypatch.setattr(building, "build_pipeline", no_build)
    assert main(["generate", "--model", "dit-tiny", "--out", str(tmp_path / "a.jpg")]) == 2
    assert "mediagen generate writes png or mp4 or gif files" in capsys.readouterr().err
    assert main(["generate", "--task", "text-to-video", "--model", "wan-tiny", "--prompt", "x", "--out",
                 str(tmp_path / "a.png")]) == 2
    assert "text-to-video writes mp4 or gif files" in capsys.readouterr().err
    assert main(["generate", "--task", "class-to-image", "--model", "dit-tiny", "--out", str(tmp_path / "a.gif")]) == 2
    assert "class-to-image writes png files" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_generate_refuses_bad_options_before_building(tmp_path, capsys, monkeypatch):
    """Each bad option is one line naming the flag, its value and what is allowed, before any model is built, and
    no file is written (--fps 0 was a ZeroDivisionError and a 0-byte clip; 0 sizes fell back to the defaults)."""
    from mediagen.pipelines import building

    def no_build(*args, **kwargs):
        raise AssertionError("a pipeline was built")

    monkeypatch.setattr(building, "build_pipeline", no_build)
    clip = ["generate", "--model", "wan-tiny", "--prompt", "x", "--steps", "1", "--frames", "3", "--height", "8",
            "--width", "8", "--out", str(tmp_path / "a.mp4")]
    refused = {
        ("--fps", "0"): "--fps 0 is not allowed: use an int >= 1",
        ("--fps", "-1"): "--fps -1 is not allowed: use an int >= 1",
        ("--device", "tpu"): "--device 'tpu' is not allowed: use cpu, cuda or cuda:N",
        ("--seed", "99999999999999999999"): "--seed 99999999999999999999 is not allowed: use an int from 0 to "
                                            "2147483647",
        ("--seed", "-1"): "--seed -1 is not allowed: use an int from 0 to 2147483647",
        ("--guidance", "-5"): "--guidance -5 is not allowed: use a number >= 0",
        ("--guidance", "nan"): "--guidance nan is not allowed: use a number >= 0",
        ("--guidance", "inf"): "--guidance inf is not allowed: use a number >= 0",
        ("--width", "0"): "--width 0 is not allowed: use an int >= 1",
        ("--height", "0"): "--height 0 is not allowed: use an int >= 1",
        ("--frames", "0"): "--frames 0 is not allowed: use an int >= 1",
        ("--frames", "-2"): "--frames -2 is not allowed: use an int >= 1",
        ("--steps", "0"): "--steps 0 is not allowed: use an int >= 1",
        ("--blocks", "abc"): "--blocks 'abc' is not allowed without --attention: --blocks is for conversions; "
                             "use it with --attention",
        ("--shift", "-1"): "--shift -1 is not allowed: use a number > 0",
        ("--shift", "nan"): "--shift nan is not allowed: use a number > 0",
    }
    more = {
        ("--attention", "mhla", "--blocks", "abc"): "--blocks 'abc' is not allowed: give ints >= 1",
        ("--attention", "linear", "--blocks", "2,2"): "--blocks is not allowed with --attention linear: it has no "
                                                      "blocks; use --blocks with --attention mhla or wan-mhla-h",
        ("--scheduler", "ddim", "--shift", "2"): "--shift is not allowed with --scheduler ddim: only the flow "
                                                 "schedulers (flow-euler, flow-unipc) have a time shift",
        ("--model", "video-sdpa", "--shift", "2"): "--shift 2 has no effect on video-sdpa: a saved pipeline samples "
                                                   "with its saved scheduler and shift; give --scheduler",
    }
    for extra, message in {**refused, **more}.items():
        assert main(clip + list(extra)) == 2, extra
        err = capsys.readouterr().err
        assert err.startswith("mediagen generate: error: ") and message in err and err.count("\n") == 1, err
    assert not list(tmp_path.iterdir())


def test_generate_leaves_no_partial_file_when_writing_fails(tmp_path, monkeypatch):
    """Media are written to a temp file in the same folder and renamed: a failing writer leaves neither a
    partial file nor its temp file, and an earlier file of the same name is kept."""
    import imageio.v3

    import pytest

    from mediagen.pipelines.export import save_media

    def broken(path, *args, **kwargs):
        with open(path, "wb") as f:
            f.write(b"half")
        raise OSError("disk full")

    out = tmp_path / "clip.mp4"
    out.write_bytes(b"earlier clip")
    monkeypatch.setattr(imageio.v3, "imwrite", broken)
    with pytest.raises(OSError, match="disk full"):
        main(["generate", "--model", "wan-tiny", "--prompt", "x", "--steps", "1", "--frames", "3", "--height", "8",
              "--width", "8", "--out", str(out)])
    assert out.read_bytes() == b"earlier clip" and list(tmp_path.iterdir()) == [out]
    monkeypatch.setattr(Image.Image, "save", lambda self, fp, *a, **k: broken(fp))
    with pytest.raises(OSError, match="disk full"):
        save_media(np.zeros((1, 8, 8, 3)), tmp_path / "still.png")
    assert list(tmp_path.iterdir()) == [out]


def test_generate_default_model_follows_the_task(tmp_path, monkeypatch):
    from mediagen.pipelines.generate_cli import _default_model

    assert _default_model(None) == "image-mhla"                      # the shipped checkpoints
    assert _default_model("class-to-image") == "image-mhla"
    assert _default_model("text-to-video") == "video-mhla"
    assert _default_model("text-to-image") == "video-sdpa"
    monkeypatch.setenv("MEDIAGEN_CHECKPOINTS", str(tmp_path))        # none shipped: the presets
    assert _default_model(None) == "dit-mnist"
    assert _default_model("text-to-video") == "wan-mmnist"


def test_generate_starts_each_task_at_the_apps_steps(tmp_path, monkeypatch):
    """Without --steps: clips at 8 and stills at 16, as the app starts them and where the shipped models' rates are
    measured; class images at 20; --steps wins."""
    import diffusers

    from mediagen.pipelines.names import START_STEPS

    seen = []
    for cls in (diffusers.FlowMatchEulerDiscreteScheduler, diffusers.DDIMScheduler):
        real = cls.set_timesteps

        def spy(self, num_inference_steps=None, *a, real=real, **k):
            seen.append(num_inference_steps)
            return real(self, num_inference_steps, *a, **k)

        monkeypatch.setattr(cls, "set_timesteps", spy)
    clip = ["--model", "wan-tiny", "--prompt", "x", "--frames", "3", "--height", "8", "--width", "8"]
    assert main(["generate", *clip, "--out", str(tmp_path / "a.mp4")]) == 0
    assert main(["generate", "--task", "text-to-image", *clip, "--out", str(tmp_path / "a.png")]) == 0
    assert main(["generate", "--model", "dit-tiny", "--class-label", "3", "--out", str(tmp_path / "b.png")]) == 0
    assert main(["generate", *clip, "--steps", "3", "--out", str(tmp_path / "c.mp4")]) == 0
    assert seen == [START_STEPS["text-to-video"], START_STEPS["text-to-image"], 20, 3] == [8, 16, 20, 3]


def test_generate_keeps_a_model_saved_with_the_asked_attention(tmp_path):
    """--attention mhla on a model saved as MHLA uses it as saved (its trained Mc and options), rather
    than converting again to fresh layers."""
    import torch

    import mediagen
    from mediagen.models import build_transformer

    model = mediagen.convert(build_transformer("wan-tiny"), "mhla", blocks=[1, 2, 2], rope="features", out_norm=True)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2 and p.shape[0] == p.shape[1] == 4:  # the Mc matrices: far from their init
                p.uniform_(0, 1)
    model.save_pretrained(tmp_path / "ckpt")
    common = ["generate", "--model", str(tmp_path / "ckpt"), "--task", "text-to-image", "--prompt", "x",
              "--steps", "2", "--height", "8", "--width", "8", "--seed", "3"]
    images = {}
    for name, extra in (("saved", []), ("mhla", ["--attention", "mhla"]), ("linear", ["--attention", "linear"])):
        out = tmp_path / f"{name}.png"
        torch.manual_seed(0)  # the tiny preset's text encoder is built with random weights around the folder
        assert main(common + extra + ["--out", str(out)]) == 0
        images[name] = np.asarray(Image.open(out)).astype(int)
    assert np.array_equal(images["mhla"], images["saved"])
    assert not np.array_equal(images["linear"], images["saved"])


def test_generate_offers_only_trained_attentions_for_shipped_models(tmp_path, capsys):
    out = tmp_path / "x.mp4"
    assert main(["generate", "--task", "text-to-video", "--attention", "linear", "--prompt", "x", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--attention linear is not allowed with the shipped video models: trained checkpoints exist for sdpa, mhla" \
        in err and not out.exists()
    assert main(["generate", "--model", "image-mhla", "--attention", "wan-mhla-h", "--out", str(tmp_path / "a.png")]) == 2
    assert "--attention wan-mhla-h is not allowed with the shipped image models" in capsys.readouterr().err


def test_generate_prompt_image_from_the_shipped_mhla_video_model(tmp_path, capsys):
    """One frame through the shipped video-mhla checkpoint: its trained blocks are fitted to the
    one-frame grid (mediagen.attention.mhla.fit_mix) instead of failing."""
    out = tmp_path / "seven.png"
    assert main(["generate", "--task", "text-to-image", "--attention", "mhla", "--prompt", "the digit 7", "--steps",
                 "1", "--height", "32", "--width", "32", "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(out)
    assert np.asarray(Image.open(out)).shape[:2] == (32, 32)


def test_generate_prints_the_apps_notes(tmp_path, monkeypatch, capsys):
    """A shipped model asked at a size it never trained at, or a prompt with no direction it knows: stderr gets the
    note the app shows beside the clip; at a trained size with a readable prompt, none."""
    import json

    from mediagen.models import build_transformer

    build_transformer("wan-tiny").save_pretrained(tmp_path / "video-sdpa")
    card = {"default_for": ["text-to-video"], "trained_on": {"digits": 1, "sizes": [{"frames": 3, "height": 8,
                                                                                      "width": 8}]}}
    (tmp_path / "video-sdpa" / "card.json").write_text(json.dumps(card))
    monkeypatch.setenv("MEDIAGEN_CHECKPOINTS", str(tmp_path))
    clip = ["generate", "--model", "video-sdpa", "--steps", "1", "--out", str(tmp_path / "a.gif")]
    assert main([*clip, "--prompt", "the digit 3 moves left", "--frames", "3", "--height", "8", "--width", "8"]) == 0
    assert "note:" not in capsys.readouterr().err
    assert main([*clip, "--prompt", "the digit 3 moves left", "--frames", "5", "--height", "16", "--width", "8"]) == 0
    assert ("note: video-sdpa was trained on 3 frames of 8×8; a clip of 5 frames of 16×8 is outside what it "
            "learned") in capsys.readouterr().err
    assert main([*clip, "--prompt", "the digit 3 spins", "--frames", "3", "--height", "8", "--width", "8"]) == 0
    assert ("note: This prompt names no direction the models know (left, right, up or down) for the digit 3, so it "
            "stands still in the clip.") in capsys.readouterr().err

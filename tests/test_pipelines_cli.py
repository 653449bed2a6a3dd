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
    assert "height=9 is not allowed" in capsys.readouterr().err
    assert main(["generate", "--model", "dit-tiny", "--prompt", "x", "--out", str(tmp_path / "a.png")]) == 2
    assert "--class-label" in capsys.readouterr().err
    assert main(["generate", "--model", "nope", "--out", str(tmp_path / "a.png")]) == 2
    assert "model='nope'" in capsys.readouterr().err
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

"""FID and KID: agreement with clean-fid on the same features, sanity on real and noise images,
clear errors, and the ``mediagen fid`` command."""

import json

import numpy as np
import pytest
import torch

from mediagen.data import load_mnist10k
from mediagen.eval.features import MissingWeightsError, get_extractor
from mediagen.eval.fid import extract_features, fid_from_features, feature_stats, frechet_distance, kernel_distance


@pytest.fixture(scope="module")
def mnist_fx():
    return get_extractor("mnist")


@pytest.fixture(scope="module")
def digits():
    images, _ = load_mnist10k("all")
    return images


@pytest.mark.filterwarnings("ignore:The `disp` argument:DeprecationWarning")
def test_fid_and_kid_match_clean_fid(tmp_path, mnist_fx, digits):
    from cleanfid import fid as cfid

    from mediagen.eval.image_io import load_images, save_images

    a, b = digits[:300], digits[5000:5200]
    save_images(a, tmp_path / "a")
    save_images(b, tmp_path / "b")
    theirs = cfid.compute_fid(str(tmp_path / "a"), str(tmp_path / "b"), mode="clean", num_workers=0,
                              batch_size=64, device=torch.device("cpu"), custom_feat_extractor=mnist_fx,
                              custom_fn_resize=mnist_fx.resize, verbose=False)
    fa = extract_features(load_images(tmp_path / "a"), mnist_fx, progress=False)
    save_images(a, tmp_path / "a.npz")                       # one compressed array: the same pixels
    assert np.array_equal(np.stack(list(load_images(tmp_path / "a.npz"))), np.asarray(a))
    fb = extract_features(b, mnist_fx, progress=False)  # arrays and PNG folders give the same features
    mu_b, sig_b = feature_stats(fb)
    ours = fid_from_features(fa, mu_b, sig_b)
    assert ours == pytest.approx(theirs, rel=1e-6)
    # KID: with subsets as large as the smaller set every subset of it is the whole set; compare on equal sizes
    np.random.seed(0)
    theirs_kid = cfid.kernel_distance(fa[:200], fb, num_subsets=3)
    assert kernel_distance(fa[:200], fb, num_subsets=3) == pytest.approx(theirs_kid, rel=1e-9)


def test_real_vs_real_small_real_vs_noise_large(mnist_fx, digits):
    fa = extract_features(digits[:1000], mnist_fx, progress=False)
    fb = extract_features(digits[5000:7000], mnist_fx, progress=False)
    noise = np.random.default_rng(0).integers(0, 256, (500, 28, 28), dtype=np.uint8)
    fn = extract_features(noise, mnist_fx, progress=False)
    mu_b, sig_b = feature_stats(fb)
    real = fid_from_features(fa, mu_b, sig_b)
    fake = fid_from_features(fn, mu_b, sig_b)
    assert 0 <= real < 0.01 * fake, (real, fake)  # measured: about 5 against 2,700
    assert kernel_distance(fa, fb, 5, 500) < 0.05 * kernel_distance(fn, fb, 5, 500)


def test_frechet_distance_exact_cases():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(500, 8))
    mu, sig = feature_stats(x)
    assert frechet_distance(mu, sig, mu, sig) == pytest.approx(0.0, abs=1e-9)
    # Gaussians N(0, I) and N(m, 4I): |m|^2 + d + 4d - 2 * 2d = |m|^2 + d
    m = np.arange(8.0)
    assert frechet_distance(np.zeros(8), np.eye(8), m, 4 * np.eye(8)) == pytest.approx(m @ m + 8)
    # a singular covariance (features constant in some dimensions) is fine: no complex sqrtm
    sig_singular = np.diag([1.0, 2.0, 0, 0, 0, 0, 0, 0])
    assert np.isfinite(frechet_distance(mu, sig, mu, sig_singular))


def test_fewer_samples_than_dims_is_a_clear_error():
    feats = np.random.default_rng(0).normal(size=(100, 1280))
    with pytest.raises(ValueError, match=r"more samples than the feature dimension .*: got 100 samples .*1280"):
        fid_from_features(feats, np.zeros(1280), np.eye(1280), "effnet-lite0")


def test_cli_few_samples_errors_before_any_work(tmp_path, capsys, digits):
    from mediagen.cli import main

    npz = tmp_path / "s.npz"
    np.savez(npz, images=digits[:50])
    rc = main(["fid", "--samples", str(npz), "--features", "effnet-lite0", "--out", str(tmp_path / "r.json")])
    err = capsys.readouterr().err
    assert rc == 2 and "more samples than the feature dimension" in err and "Imaginary" not in err
    rc = main(["fid", "--samples", str(npz), "--features", "effnet-lite0", "--num-samples", "1000"])
    assert rc == 2 and "--num-samples 1281 or more" in capsys.readouterr().err


def test_too_few_samples_error_says_which_flag_to_change(tmp_path, capsys, digits):
    """The README's CPU tip (300 samples) suits the 128-d mnist features only; with effnet-lite0 the one-line
    error names the flag, its value, the count that works and the lower-dimensional features."""
    import re
    from pathlib import Path

    from mediagen.cli import main
    from mediagen.eval.features import FEATURE_DIMS

    npz = tmp_path / "s.npz"
    np.savez(npz, images=digits[:300])
    rc = main(["fid", "--samples", str(npz), "--features", "effnet-lite0", "--num-samples", "300"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert "--num-samples=300 is too few: use --num-samples 1281 or more" in err and "mnist (128-d, needs 129)" in err
    rc = main(["fid", "--samples", str(npz), "--splits", "3", "--quiet"])
    assert rc == 2 and "--splits=3 leaves 100 samples per split: use fewer --splits or 387" in capsys.readouterr().err
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    tip = re.search(r"sample FID with\s+`--num-samples (\d+)[^`]*--features (\S+?)`", readme)
    assert tip is not None, "the README's CPU tip should name the features its sample count suits"
    assert int(tip.group(1)) > FEATURE_DIMS[tip.group(2)]
    assert "--num-samples 1281" in readme


def test_inception_offline_error_names_the_file(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("MEDIAGEN_INCEPTION_WEIGHTS", raising=False)
    monkeypatch.setattr("tempfile.gettempdir", lambda: str(tmp_path))
    with pytest.raises(MissingWeightsError, match=r"inception-2015-12-05\.pt.*~/.cache/mediagen"):
        get_extractor("inception")
    from mediagen.cli import main

    rc = main(["fid", "--samples", str(tmp_path), "--features", "inception", "--reference", "mnist-all",
               "--inception-weights", str(tmp_path / "nope.pt")])
    err = capsys.readouterr().err
    assert rc == 2 and "inception-2015-12-05.pt" in err and "nvlabs" in err


def test_effnet_lite0_is_the_real_imagenet_network():
    """Grace Hopper (matplotlib's sample photo) is classified as 'military uniform' (ImageNet 652)."""
    import matplotlib
    from PIL import Image

    path = f"{matplotlib.get_data_path()}/sample_data/grace_hopper.jpg"
    img = np.asarray(Image.open(path).convert("RGB"))
    fx = get_extractor("effnet-lite0")
    x = torch.from_numpy(fx.resize(img)).permute(2, 0, 1)[None]
    with torch.no_grad():
        logits = fx.model((x - 127.0) / 128.0)
    assert logits.argmax().item() == 652
    assert fx(x).shape == (1, 1280)


def test_fid_cli_on_samples_with_mnist_reference(tmp_path, digits):
    from mediagen.cli import main

    npz = tmp_path / "samples.npz"
    np.savez(npz, images=digits[8000:8400])
    out, stats = tmp_path / "fid.json", tmp_path / "ref.npz"
    rc = main(["fid", "--samples", str(npz), "--reference", "mnist", "--reference-num", "1000",
               "--save-reference-stats", str(stats), "--out", str(out), "--quiet"])
    assert rc == 0
    first = json.loads(out.read_text())
    assert first["features"] == "mnist" and first["num_samples"] == 400 and first["num_reference"] == 1000
    assert first["reference"] == "mnist" and first["reference_set"].startswith("mnist10k held_out")
    # real digits against real digits: about 15 at these sample sizes; uniform noise gives about 2,700
    assert 0 <= first["fid"] < 40 and first["kid"] is not None
    # the saved statistics give the same FID; a stats file made with other features is refused
    rc = main(["fid", "--samples", str(npz), "--reference", str(stats), "--out", str(out), "--quiet"])
    again = json.loads(out.read_text())
    assert rc == 0 and again["fid"] == pytest.approx(first["fid"], rel=1e-9)
    assert again["reference_set"] == first["reference_set"]      # the statistics file carries it
    other = tmp_path / "other.npz"
    np.savez(other, mu=np.zeros(128), sigma=np.eye(128), features=np.array("inception"))
    assert main(["fid", "--samples", str(npz), "--reference", str(other), "--features", "mnist"]) == 2


def test_fid_of_disjoint_splits(tmp_path, capsys, mnist_fx, digits):
    """--splits K scores K disjoint equal parts: each part's FID is the FID of those samples alone, the parts
    differ (they hold different digits), and a part below the feature dimension is refused before any work."""
    from mediagen.cli import main
    from mediagen.eval.fid import split_fids
    from mediagen.eval.reference import load_reference

    npz, out = tmp_path / "samples.npz", tmp_path / "fid.json"
    np.savez(npz, images=digits[8000:8450])
    rc = main(["fid", "--samples", str(npz), "--reference", "mnist", "--reference-num", "1000", "--splits", "3",
               "--out", str(out), "--quiet"])
    assert rc == 0
    got = json.loads(out.read_text())
    assert got["split_size"] == 150 and len(got["split_fids"]) == 3
    ref = load_reference("mnist", mnist_fx, 64, 1000, False)
    feats = extract_features(digits[8000:8450], mnist_fx, progress=False)
    for i, value in enumerate(got["split_fids"]):
        assert value == pytest.approx(fid_from_features(feats[150 * i:150 * (i + 1)], ref.mu, ref.sigma), rel=1e-9)
    assert len(set(np.round(got["split_fids"], 6))) == 3
    assert "disjoint parts of 150" in capsys.readouterr().out
    # 450 / 4 = 112 samples per part for 128-d features; a split count below 2
    assert main(["fid", "--samples", str(npz), "--splits", "4", "--quiet"]) == 2
    assert "samples per split" in capsys.readouterr().err
    assert main(["fid", "--samples", str(npz), "--splits", "1", "--quiet"]) == 2
    assert "--splits=1 is not allowed" in capsys.readouterr().err
    with pytest.raises(ValueError, match="splits=1"):
        split_fids(feats, ref.mu, ref.sigma, 1)


def test_checkpoint_without_pipeline_is_a_clear_error(tmp_path, capsys):
    from mediagen.cli import main

    rc = main(["fid", "--checkpoint", str(tmp_path / "missing"), "--num-samples", "200", "--quiet"])
    assert rc == 2 and "--checkpoint" in capsys.readouterr().err


def test_fid_from_a_checkpoint_samples_through_the_pipelines(tmp_path):
    """A preset name stands for a checkpoint (random weights): sampling goes through mediagen.pipelines."""
    from mediagen.cli import main

    out = tmp_path / "fid.json"
    rc = main(["fid", "--checkpoint", "dit-tiny", "--num-samples", "130", "--steps", "1", "--batch-size", "65",
               "--reference-num", "300", "--save-samples", str(tmp_path / "s"), "--out", str(out), "--quiet"])
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["num_samples"] == 130 and res["samples"] == "dit-tiny"
    assert res["fid"] > 100  # untrained model: far from real digits
    assert len(list((tmp_path / "s").glob("*.png"))) == 130


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_inception_weights_flag_is_used(tmp_path):
    """--inception-weights reaches clean-fid's Inception wrapper, whatever the file is named. A tiny
    TorchScript stand-in with the same interface (``.layers`` -> (B, 2048, 1, 1)) checks the plumbing."""

    class Layers(torch.nn.Module):
        def forward(self, x):
            return x.mean(dim=(2, 3), keepdim=True).repeat(1, 683, 1, 1)[:, :2048]

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = Layers()

        def forward(self, x):
            return self.layers(x)

    path = tmp_path / "my-inception.pt"
    torch.jit.save(torch.jit.script(Net()), str(path))
    fx = get_extractor("inception", inception_weights=str(path))
    x = torch.full((2, 3, 299, 299), 128.0 + 64.0)
    feats = fx(x)
    assert feats.shape == (2, 2048) and torch.allclose(feats, torch.full_like(feats, 0.5))


def test_digit_references_follow_the_training_split():
    """--reference mnist is the held-out part the training configs leave out; mnist-train is the training
    part and mnist-all both. Training images never enter the default reference."""
    from mediagen.data import MNIST_HELD_OUT
    from mediagen.eval.reference import MNIST_SPLIT_SIZES, mnist_reference_set, reference_images

    held, _ = load_mnist10k("held_out")
    train, _ = load_mnist10k("train")
    everything, _ = load_mnist10k("all")
    assert np.array_equal(reference_images("mnist"), held) and len(held) == 2000
    assert np.array_equal(reference_images("mnist-train"), train) and len(train) == 8000
    assert np.array_equal(reference_images("mnist-all"), everything)
    assert np.array_equal(reference_images("mnist", 100), everything[MNIST_HELD_OUT][:100])
    assert MNIST_SPLIT_SIZES == {"held_out": 2000, "train": 8000, "all": 10000}
    assert mnist_reference_set("mnist", 1000) == "mnist10k held_out: digits 8000-9999, not trained on (1000 images)"
    train_bytes = {img.tobytes() for img in train}
    assert not any(img.tobytes() in train_bytes for img in held)


def test_reference_choice_is_in_the_json_and_checked_before_work(tmp_path, capsys, digits):
    from mediagen.cli import main

    npz, out = tmp_path / "s.npz", tmp_path / "fid.json"
    np.savez(npz, images=digits[:200])
    assert main(["fid", "--samples", str(npz), "--reference", "mnist-train", "--reference-num", "300",
                 "--out", str(out), "--quiet"]) == 0
    got = json.loads(out.read_text())
    assert got["reference"] == "mnist-train" and got["num_reference"] == 300
    assert got["reference_set"] == "mnist10k train: digits 0-7999, the training images (300 images)"
    # inception's 2,048 dimensions need more than the 2,000 held-out digits: refused before its weights are looked up
    rc = main(["fid", "--samples", str(npz), "--features", "inception", "--num-samples", "3000",
               "--inception-weights", str(tmp_path / "missing.pt")])
    err = capsys.readouterr().err
    assert rc == 2 and "--reference mnist holds 2000 images: use --reference mnist-train (8000) or " \
                       "--reference mnist-all (10000)" in err and "inception-2015" not in err
    rc = main(["fid", "--samples", str(npz), "--reference-num", "100"])
    assert rc == 2 and "--reference-num=100 is too few: use --reference-num 129 or more" in capsys.readouterr().err
    rc = main(["fid", "--samples", str(npz), "--reference", "mnist-test"])
    assert rc == 2 and "'mnist', 'mnist-train', 'mnist-all'" in capsys.readouterr().err


def test_too_few_reference_images_of_a_folder_names_reference_num(tmp_path, capsys, digits):
    """--reference-num cuts a folder / .npz reference short: the error names that flag (as it does for the digit
    references), not the reference, which holds enough images."""
    from mediagen.cli import main

    samples, ref = tmp_path / "s.npz", tmp_path / "ref.npz"
    np.savez(samples, images=digits[:200])
    np.savez(ref, images=digits[5000:5500])                  # 500 images: enough for the 128-d mnist features
    rc = main(["fid", "--samples", str(samples), "--reference", str(ref), "--features", "mnist",
               "--reference-num", "100", "--quiet", "--out", str(tmp_path / "r.json")])
    err = capsys.readouterr().err
    assert rc == 2 and "--reference-num=100 is too few: use --reference-num 129 or more" in err, err
    assert "holds 100 images" not in err
    small = tmp_path / "small.npz"
    np.savez(small, images=digits[5000:5100])
    rc = main(["fid", "--samples", str(samples), "--reference", str(small), "--features", "mnist", "--quiet",
               "--out", str(tmp_path / "r.json")])
    assert rc == 2 and f"--reference {small} holds 100 images: give 129 or more" in capsys.readouterr().err

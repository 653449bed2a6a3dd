"""Sampling images for FID in batches, on a stand-in pipeline that draws each image from what it was asked
(its class label, its prompt and its generator's seed): n images exactly, classes in turn over the whole run
(not restarting at every batch), each batch seeded with seed + its start (batches draw different noise), and
float outputs rounded to the nearest uint8 value."""

import numpy as np
import pytest
import torch

from mediagen.eval import sampling
from mediagen.eval.sampling import _to_uint8, sample_images


class ClassPipe:
    """Image j of a call is filled with (class label, generator seed, 0); it may return more images than asked."""

    def __init__(self, extra=0):
        self.extra, self.calls = extra, []

    def __call__(self, class_labels, generator=None, output_type="np"):
        seed = generator.initial_seed()
        self.calls.append((list(class_labels), seed))
        labels = list(class_labels) + [99] * self.extra
        return np.stack([np.full((2, 2, 3), (c, seed, 0), np.uint8) for c in labels])


class PromptPipe:
    def __init__(self):
        self.calls = []

    def __call__(self, prompt, generator=None, output_type="np"):
        self.calls.append(list(prompt))
        return np.stack([np.full((2, 2, 1), int(p.split()[-1]), np.uint8) for p in prompt])


def run(monkeypatch, pipe, **kw):
    monkeypatch.setattr(sampling, "load_pipeline", lambda checkpoint, device="cpu", dtype=None: pipe)
    return sample_images("stand-in", progress=False, **kw)


@pytest.mark.parametrize("extra", [0, 2])
def test_classes_run_in_turn_and_each_batch_has_its_seed(monkeypatch, extra):
    pipe = ClassPipe(extra)
    images = run(monkeypatch, pipe, n=23, batch_size=8, seed=5)
    assert images.shape == (23, 2, 2, 3) and images.dtype == np.uint8
    assert images[:, 0, 0, 0].tolist() == [i % 10 for i in range(23)]        # balanced over the run
    assert images[:, 0, 0, 1].tolist() == [5 + 8 * (i // 8) for i in range(23)]
    assert [len(labels) for labels, _ in pipe.calls] == [8, 8, 7]
    assert len({seed for _, seed in pipe.calls}) == 3
    # a model with 4 classes: labels wrap at 4
    four = run(monkeypatch, ClassPipe(), n=6, batch_size=4, num_classes=4)
    assert four[:, 0, 0, 0].tolist() == [0, 1, 2, 3, 0, 1]


def test_prompts_run_in_turn_over_the_batches(monkeypatch):
    pipe = PromptPipe()
    prompts = [f"prompt {i}" for i in range(4)]
    images = run(monkeypatch, pipe, n=7, batch_size=3, prompts=prompts)
    assert images.shape == (7, 2, 2, 3)                                       # grey repeated to RGB
    assert images[:, 0, 0, 0].tolist() == [0, 1, 2, 3, 0, 1, 2]
    assert (images[..., 0] == images[..., 2]).all()


def test_float_outputs_round_to_the_nearest_uint8():
    x = np.linspace(-0.1, 1.1, 1001, dtype=np.float32)
    want = np.round(np.clip(x.astype(np.float64), 0, 1) * 255).astype(np.uint8)
    assert np.array_equal(_to_uint8(x), want)
    assert np.array_equal(_to_uint8(torch.from_numpy(x)), want)
    assert _to_uint8(np.array([254.6 / 255, 0.999, 0.4 / 255])).tolist() == [255, 255, 0]
    u8 = np.arange(256, dtype=np.uint8)
    assert np.array_equal(_to_uint8(u8), u8)

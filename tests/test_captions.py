"""Moving-MNIST captions in many wordings (mediagen/training/data/wordings.py): variety, held-out wordings
the training generator never produces, and every caption naming the right digits and directions, read
back by a parser written here, independently of the generator's word lists."""

from __future__ import annotations

import re

import numpy as np
import pytest

from mediagen.training import ConfigError, load_config
from mediagen.training.data import build_dataset
from mediagen.training.data import wordings
from mediagen.training.data.moving_mnist import DIRECTIONS, STILL, MovingMNISTDataset, clip_caption
from mediagen.training.data.wordings import (HELD_OUT, HELD_OUT_MARKERS, VariedCaptions, caption_corpus,
                                             held_out_caption, held_out_grid, varied_caption)

NUMBERS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine".split())}
# every way a person writes the four directions that this parser accepts
WAYS = {"left": "left", "leftward": "left", "leftwards": "left", "right": "right", "rightward": "right",
        "rightwards": "right", "up": "up", "upward": "up", "upwards": "up", "down": "down",
        "downward": "down", "downwards": "down"}


def read_back(caption: str) -> tuple[list[int], list[str | None]]:
    """(digits, direction of each digit) by the rule of prompts: a direction word applies to the digits
    named since the previous one; digits after the last direction word take the last one."""
    digits, directions, pending, last = [], [], 0, None
    for word in re.findall(r"[a-z]+|\d", caption.lower()):
        if word.isdigit() or word in NUMBERS:
            digits.append(int(word) if word.isdigit() else NUMBERS[word])
            pending += 1
        elif word in WAYS:
            last = WAYS[word]
            directions += [last] * pending
            pending = 0
    return digits, directions + [last] * pending


def draws(n: int = 3000, seed: int = 0):
    """n (digits, directions, caption) of random one- and two-digit clips, moving or still."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        k = 1 + int(rng.random() < 0.5)
        digits = [int(x) for x in rng.integers(10, size=k)]
        directions = [STILL] * k if rng.random() < 0.15 else [list(DIRECTIONS)[int(j)] for j in rng.integers(4, size=k)]
        out.append((digits, directions, varied_caption(digits, directions, rng)))
    return out


def test_the_default_caption_is_the_template_the_shipped_models_read():
    assert clip_caption([3], ["left"]) == "the digit 3 moves left"
    assert clip_caption([3, 8], ["left", "down"]) == "the digit 3 moves left while the digit 8 moves down"
    assert clip_caption([3], [STILL]) == "the digit 3"
    assert clip_caption([3], ["left"], np.random.default_rng(5)) == varied_caption([3], ["left"],
                                                                                   np.random.default_rng(5))
    assert set(wordings.DIRECTION_PHRASES) == set(DIRECTIONS) and wordings.STILL == STILL


def test_many_wordings_of_one_clip_and_many_sentence_shapes():
    rng = np.random.default_rng(0)
    one = {varied_caption([3], ["left"], rng) for _ in range(1000)}
    assert len(one) >= 300, len(one)
    assert any("three" in c.lower() for c in one) and any(" 3" in f" {c}" for c in one)
    assert any("digit" not in c.lower() for c in one) and any(c.isupper() for c in one)
    assert any(c.lower().startswith(("left", "to the left", "toward", "towards")) for c in one)  # word order
    for verb in ("moves", "slides", "drifts", "goes", "heading", "to the left", "handwritten",
                 "on a black background"):
        assert any(verb in c.lower() for c in one), verb
    lengths = [len(c.split()) for c in one]
    assert min(lengths) <= 3 and max(lengths) >= 10
    # sentence shapes: the digit's name and the direction phrase blanked out
    shapes = set()
    for digits, directions, caption in draws():
        text = caption.lower()
        for word in sorted(WAYS, key=len, reverse=True):
            text = re.sub(rf"\b{word}\b", "<dir>", text)
        shapes.add(re.sub(r"\b(\d|" + "|".join(NUMBERS) + r")\b", "<n>", text))
    assert len(shapes) >= 1000, len(shapes)


def test_wordings_are_deterministic_given_the_seed():
    assert caption_corpus(50, seed=3) == caption_corpus(50, seed=3)
    assert caption_corpus(50, seed=3) != caption_corpus(50, seed=4)
    assert [c for *_, c in draws(100, seed=1)] == [c for *_, c in draws(100, seed=1)]


def test_every_caption_names_its_digits_and_directions():
    for digits, directions, caption in draws():
        want = [None] * len(digits) if directions[0] == STILL else directions
        assert read_back(caption) == (digits, want), caption
    for caption in caption_corpus(500, seed=2):                        # the distillation corpus too
        digits, directions = read_back(caption)
        assert 1 <= len(digits) <= 2 and len(set(directions) - {None}) <= 2, caption


def test_the_scorer_reads_the_training_and_held_out_wordings():
    from mediagen.eval.moving_mnist import parse_prompt

    for digits, directions, caption in draws(1000, seed=4):
        parsed = parse_prompt(caption)
        want = [None] * len(digits) if directions[0] == STILL else directions
        assert (parsed.digits, parsed.directions, parsed.count) == (digits, want, len(digits)), caption
    captions, ds, ms = held_out_grid()
    for caption, d, m in zip(captions, ds, ms):
        parsed = parse_prompt(caption)
        assert (parsed.digits, parsed.directions) == ([d], [m]), caption


def test_held_out_wordings_name_their_digits_and_never_come_from_training():
    captions, ds, ms = held_out_grid()
    assert len(captions) == len(set(captions)) == 40 * len(HELD_OUT["one"]) >= 320
    for caption, d, m in zip(captions, ds, ms):
        assert read_back(caption) == ([d], [m]), caption
    for t in range(len(HELD_OUT["two"])):
        assert read_back(held_out_caption([3, 8], ["left", "down"], t)) == ([3, 8], ["left", "down"])
    for t in range(len(HELD_OUT[STILL])):
        assert read_back(held_out_caption([7], [STILL], t)) == ([7], [None])
    held = set(captions) | set(caption_corpus(2000, seed=1, held_out=True))

    def marks(text):
        return set(re.findall(r"[a-z]+|[?;]", text.lower())) & set(HELD_OUT_MARKERS)

    # every held-out wording carries a mark, and no training wording does: the sets cannot meet
    assert all(marks(c) for c in held)
    training = [c for *_, c in draws(5000, seed=7)] + caption_corpus(3000, seed=8)
    assert not [c for c in training if marks(c)][:3]
    assert not held & set(training)


@pytest.fixture(scope="module")
def clips():
    return MovingMNISTDataset(resolution=32, num_frames=4, length=64, seed=1, static_fraction=0.2)


def test_varied_captions_keep_the_clips_and_name_what_they_show(clips):
    varied = VariedCaptions(clips, 0.75, seed=1)
    changed = 0
    for i in range(len(clips)):
        plain, item = clips[i], varied[i]
        assert np.array_equal(plain["pixels"].numpy(), item["pixels"].numpy())
        ks, names = clips.plan(i)[:2]
        digits = [int(clips.labels[k]) for k in ks]
        want = [None] if names[0] == STILL else list(names)
        assert read_back(item["caption"]) == (digits, want), item["caption"]
        changed += item["caption"] != plain["caption"]
    assert 32 <= changed <= 60, changed                                # about 3 in 4 of 64 clips
    batch = varied.render_batch(list(range(8)), "cpu")
    assert batch["caption"] == [varied[i]["caption"] for i in range(8)]
    assert np.array_equal(batch["pixels"].numpy(), clips.render_batch(list(range(8)), "cpu")["pixels"].numpy())
    again = VariedCaptions(clips, 0.75, seed=1)
    assert [again[i]["caption"] for i in range(16)] == [varied[i]["caption"] for i in range(16)]
    other = VariedCaptions(clips, 0.75, seed=2)
    assert [other[i]["caption"] for i in range(16)] != [varied[i]["caption"] for i in range(16)]
    assert varied.all_captions() == clips.all_captions() and len(varied) == 64
    none = VariedCaptions(clips, 0.0, seed=1)
    assert [none[i]["caption"] for i in range(16)] == [clips[i]["caption"] for i in range(16)]
    with pytest.raises(ValueError, match="data.varied_captions=1.5"):
        VariedCaptions(clips, 1.5)


def test_the_config_key_turns_varied_wordings_on():
    base = ["output_dir=x", "task=text-to-video", "model.preset=wan-mmnist", "data.dataset=moving-mnist",
            "data.resolution=32", "data.num_frames=4", "data.length=16"]
    plain = build_dataset(load_config(None, base).data, "text-to-video")
    assert isinstance(plain, MovingMNISTDataset)                       # default: the template, as shipped
    varied = build_dataset(load_config(None, [*base, "data.varied_captions=1.0"]).data, "text-to-video")
    assert isinstance(varied, VariedCaptions) and varied.share == 1.0
    assert sum(varied[i]["caption"] != plain[i]["caption"] for i in range(16)) >= 12
    with pytest.raises(ConfigError, match=r"data\.varied_captions=2\.0 is not allowed"):
        load_config(None, [*base, "data.varied_captions=2"])


def test_a_digit_whose_name_starts_with_a_vowel_sound_takes_an():
    """"a 8" and "a eight" are not English, and captions are meant to read like a person's prompt: before
    8 or "eight" the article is "an", before every other digit it stays "a"."""
    captions = [c.lower() for *_, c in draws(3000, seed=9)]
    assert not [c for c in captions if re.search(r"\ba (8|eight)\b", c)][:3]
    others = "|".join([str(d) for d in range(10) if d != 8] + [w for w in NUMBERS if w != "eight"])
    assert not [c for c in captions if re.search(rf"\ban ({others})\b", c)][:3]
    assert any(re.search(r"\ban 8\b", c) for c in captions) and any(re.search(r"\ban eight\b", c) for c in captions)
    assert any(re.search(r"\ba [0-79]\b", c) for c in captions)


def test_the_held_out_corpus_draws_every_held_out_wording():
    """The held-out corpus scores how far a model generalises to wordings it never saw, so every held-out
    wording of each kind (one digit, two digits, still) must turn up in it, not only some of them."""
    seen = {kind: set() for kind in HELD_OUT}
    for caption in caption_corpus(1500, seed=5, held_out=True):
        digits, directions = read_back(caption)
        if directions == [None] * len(digits):
            kind, directions = STILL, [STILL] * len(digits)
        else:
            kind = "one" if len(digits) == 1 else "two"
        forms = [t for t in range(len(HELD_OUT[kind])) if held_out_caption(digits, directions, t) == caption]
        assert forms, caption
        seen[kind].update(forms)
    assert seen == {kind: set(range(len(forms))) for kind, forms in HELD_OUT.items()}, seen

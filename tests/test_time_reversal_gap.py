"""benchmarks.time_reversal.caption_gap: 0 for a model that ignores the caption, not 0 for one that reads
the direction word; the opposite captions swap left/right and up/down."""

from types import SimpleNamespace

import pytest
import torch

from benchmarks.time_reversal import caption_gap
from mediagen.training.data.moving_mnist import MovingMNISTDataset

WORDS = ("left", "right", "up", "down")


class DirectionEncoder:
    """Text states whose first token is the one-hot of the caption's direction word."""

    def __init__(self):
        self.seen = []

    def encode_text(self, prompts, max_length):
        self.seen.append(list(prompts))
        h = torch.zeros(len(prompts), max_length, 8)
        for i, p in enumerate(prompts):
            h[i, 0, [w in p.split() for w in WORDS].index(True)] = 1.0
        return h, torch.ones(len(prompts), max_length, dtype=torch.long)


class Model(torch.nn.Module):
    """Predicts scale * xt, with scale read from the caption's direction when ``reads`` is set."""

    def __init__(self, reads):
        super().__init__()
        self.reads, self.config = reads, SimpleNamespace(in_channels=1)

    def forward(self, xt, t, context):
        scale = 0.5 + context[:, 0, :4] @ torch.tensor([0.1, 0.2, 0.3, 0.4]) if self.reads else torch.full(
            (len(xt),), 0.5)
        return SimpleNamespace(sample=xt * scale[:, None, None, None, None])


@pytest.mark.parametrize("reads", [False, True])
def test_caption_gap(reads):
    data = MovingMNISTDataset(resolution=64, num_frames=16, split="held_out", seed=0)
    encoder = DirectionEncoder()
    pipe = SimpleNamespace(transformer=Model(reads), text_encoder=encoder, tokenizer=None)
    gap = caption_gap(pipe, data, 6, [0.5], 0)
    own, flipped = encoder.seen
    swap = dict(zip(WORDS, ("right", "left", "down", "up")))
    assert flipped == [" ".join(swap.get(w, w) for w in c.split()) for c in own]
    assert (gap == 0.0) if not reads else abs(gap) > 1e-3

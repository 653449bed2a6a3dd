"""benchmarks/wan_model.py: every variant runs the attention it names, whichever variant the model ran before
(the benchmark switches one model between variants, eager then compiled)."""

import itertools

import pytest
import torch
from diffusers.models.transformers.transformer_wan import WanAttnProcessor

from benchmarks.common import ProjectionsOnly
from benchmarks.wan_model import VARIANTS, NoSelfAttention, set_variant
from mediagen.models.presets import build_transformer
from mediagen.models.processors import WanMHLAProcessor

pytestmark = pytest.mark.usefixtures("one_thread")
GRID, BLOCKS = (3, 4, 6), (1, 2, 2)     # tokens of a 3x8x12 latent with patch (1, 2, 2)
# sdpa-flash computes what sdpa does (another backend of the same softmax) and needs a GPU to run
COMPUTED = [v for v in VARIANTS if v != "sdpa-flash"]
# what each variant's layers must be: 3 layers, the hybrid has softmax in one of every three
LAYERS = {"sdpa": [WanAttnProcessor] * 3, "sdpa-flash": [WanAttnProcessor] * 3, "mhla": [WanMHLAProcessor] * 3,
          "mhla-rope": [WanMHLAProcessor] * 3, "projections-only": [ProjectionsOnly] * 3,
          "no-self-attn": [NoSelfAttention] * 3}


def model():
    torch.manual_seed(0)
    return build_transformer("wan-tiny", num_layers=3).eval()


def inputs():
    g = torch.Generator().manual_seed(1)
    return torch.randn(1, 1, 3, 8, 12, generator=g), torch.tensor([500.0]), torch.randn(1, 5, 32, generator=g)


def forward(m, variant):
    set_variant(m, variant, GRID, BLOCKS)
    with torch.no_grad():
        return m(*inputs(), return_dict=False)[0]


@pytest.fixture(scope="module")
def fresh():
    """Each variant's output on a model that ran nothing before it."""
    return {v: forward(model(), v) for v in COMPUTED}


def test_variants_compute_different_things(fresh):
    for a, b in itertools.combinations(COMPUTED, 2):
        assert (fresh[a] - fresh[b]).abs().max() > 1e-3, f"{a} and {b} give the same output"


def every_ordered_pair(names):
    """A walk through ``names`` in which every ordered pair (a, b), a != b, is one step: an Euler circuit of
    the complete directed graph (Hierholzer), so each variant runs once per predecessor, not twice."""
    left = {a: [b for b in names if b != a] for a in names}
    stack, walk = [names[0]], []
    while stack:
        if left[stack[-1]]:
            stack.append(left[stack[-1]].pop())
        else:
            walk.append(stack.pop())
    return walk[::-1]


def test_a_variant_does_not_depend_on_the_one_before(fresh):
    """Every ordered pair: variant b right after variant a gives b's own output (the compiled pass used to
    start with sdpa on the layers the eager pass's last variant had left, e.g. no self-attention)."""
    walk = every_ordered_pair(COMPUTED)
    assert set(zip(walk, walk[1:])) == set(itertools.permutations(COMPUTED, 2))
    m = model()
    set_variant(m, walk[0], GRID, BLOCKS)
    for a, b in zip(walk, walk[1:]):
        torch.testing.assert_close(forward(m, b), fresh[b], rtol=0, atol=0, msg=lambda s: f"{b} after {a}: {s}")


def test_every_variant_sets_every_layer():
    m = model()
    for a, b in itertools.permutations(VARIANTS, 2):
        set_variant(m, a, GRID, BLOCKS)
        set_variant(m, b, GRID, BLOCKS)
        got = [type(block.attn1.processor) for block in m.blocks]
        if b.startswith("hybrid"):
            assert got.count(WanAttnProcessor) == 1 and got.count(WanMHLAProcessor) == 2, (a, b, got)
        else:
            assert got == LAYERS[b], (a, b, got)
    with pytest.raises(ValueError, match="variant='flash' is not allowed"):
        set_variant(m, "flash", GRID, BLOCKS)

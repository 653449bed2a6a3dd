"""The diffusers transformers we convert, and what conversion needs to know about each.

For every supported class: where its transformer blocks live, how its self-attention layer is
reached, which processor serves it, what the stock (softmax) processor is, and how to read the
token grid from the transformer's input.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from diffusers import DiTTransformer2DModel, SanaTransformer2DModel, WanTransformer3DModel
from diffusers.models.attention_processor import AttnProcessor2_0
from diffusers.models.transformers.transformer_wan import WanAttnProcessor

from .latent_grid import image_grid, video_grid
from .processors import DiTMHLAProcessor, GridSelfAttnProcessor, SanaMHLAProcessor, WanMHLAProcessor


@dataclass(frozen=True)
class Family:
    name: str
    base: type
    blocks_attr: str                       # model attribute holding the transformer blocks
    processor: type[GridSelfAttnProcessor]
    stock_processor: Callable[[], object]  # the softmax processor of "sdpa" layers (a fresh Wan/DiT has it)
    grid_of: Callable                      # (model, hidden_states) -> token grid
    ndim: int                              # axes of the token grid

    def self_attentions(self, model):
        return [block.attn1 for block in getattr(model, self.blocks_attr)]

    def default_grid(self, model) -> tuple[int, ...] | None:
        """The token grid the model was built for, when its config says (DiT, SANA: sample_size)."""
        if self.name in ("dit", "sana"):
            side = model.config.sample_size // model.config.patch_size
            return (side, side)
        return None


def _wan_grid(model, x):
    return video_grid(x, tuple(model.config.patch_size))


def _dit_grid(model, x):
    return image_grid(x, model.config.patch_size)


# SANA's own self-attention is ReLU linear attention (SanaLinearAttnProcessor2_0): its "linear"
# conversion (eps=1e-15) computes the same; "sdpa" there is softmax, which SANA was not trained with.
# Layers a conversion does not name keep their processor, so a SANA hybrid keeps its linear attention.


FAMILIES = (
    Family("wan", WanTransformer3DModel, "blocks", WanMHLAProcessor, WanAttnProcessor, _wan_grid, 3),
    Family("dit", DiTTransformer2DModel, "transformer_blocks", DiTMHLAProcessor, AttnProcessor2_0, _dit_grid, 2),
    Family("sana", SanaTransformer2DModel, "transformer_blocks", SanaMHLAProcessor, AttnProcessor2_0, _dit_grid, 2),
)


def family_of(model) -> Family:
    for fam in FAMILIES:
        if isinstance(model, fam.base):
            return fam
    names = ", ".join(f.base.__name__ for f in FAMILIES)
    raise ValueError(f"model of type {type(model).__name__} is not supported: use one of {names} "
                     f"(or a pipeline holding one as .transformer)")

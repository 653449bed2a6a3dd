"""``mediagen.convert``: swap the self-attention of a diffusers transformer for MHLA, in place."""

from __future__ import annotations

import warnings
from typing import Sequence

from ..kernels.mhla.layout import check_grid_blocks
from .attention_setup import apply_attention
from .attention_spec import AttentionSpec, auto_blocks, layer_attentions
from .converted import CONFIG_KEY, converted_class_for
from .families import family_of


def convert(model, attention: str | Sequence[str] = "mhla", *, blocks: Sequence[int] | None = None,
            layers: Sequence[int] | None = None, grid: Sequence[int] | None = None,
            feature_map: str = "relu", normalize: bool = True, eps: float = 1e-6, scale: float | None = None,
            per_head_mix: bool = False, out_norm: bool = False, out_gate: bool = False, cpe_kernel: int = 0,
            rope: str = "none"):
    """Convert a ``WanTransformer3DModel`` / ``DiTTransformer2DModel`` / ``SanaTransformer2DModel`` (or
    a pipeline's ``.transformer``) in place and return it.

    Every pretrained weight is kept; only Mc (and the optional out-norm, gate and CPE weights) are
    new. The result saves and loads with ``save_pretrained``/``from_pretrained`` and comes back
    converted.

    Args:
        attention: "sdpa", "linear", "mhla", "wan-mhla-h" (softmax every third layer, MHLA in the
            rest), or a list with one of "sdpa"/"linear"/"mhla" per layer.
        layers: with a single name, the layer indices that get it; the others stay "sdpa".
        blocks: block count per grid axis ((F, H, W) for Wan, (H, W) for DiT and SANA). When None they
            are chosen from ``grid`` (or DiT's / SANA's sample_size) with M^2 <= N.
        grid: the token grid the model will mostly run at, used to choose and check ``blocks``.
        feature_map, normalize, eps, scale, per_head_mix, out_norm, out_gate, cpe_kernel, rope:
            MHLA options, see ``AttentionSpec``.

    The official Wan2.1 MHLA recipe is ``attention="wan-mhla-h", rope="features", out_norm=True``.
    Softmax layers keep the stock processor; to force FlashAttention there use diffusers'
    ``model.set_attention_backend("flash")`` (Wan). SANA's own self-attention is ReLU linear
    attention: ``attention="linear", eps=1e-15`` reproduces it, "mhla" is the paper's SANA-MHLA, and
    "sdpa" gives softmax layers (not what SANA was trained with). Mc stays in [0, 1] during training with
    ``mediagen.attention.register_mix_clipping(optimizer, model)``.
    """
    model = getattr(model, "_orig_mod", model)  # a torch.compile wrapper: convert what it wraps
    if hasattr(model, "components") and hasattr(model, "register_modules"):  # a DiffusionPipeline
        kwargs = dict(attention=attention, blocks=blocks, layers=layers, grid=grid, feature_map=feature_map,
                      normalize=normalize, eps=eps, scale=scale, per_head_mix=per_head_mix, out_norm=out_norm,
                      out_gate=out_gate, cpe_kernel=cpe_kernel, rope=rope)
        names = [n for n in ("transformer", "transformer_2") if getattr(model, n, None) is not None]
        if not names:
            raise ValueError("the pipeline has no .transformer to convert")
        for name in names:
            convert(getattr(model, name), **kwargs)
            model.register_modules(**{name: getattr(model, name)})  # record the new class in model_index
        return model

    fam = family_of(model)
    num_layers = len(fam.self_attentions(model))
    names = layer_attentions(attention, num_layers, layers)
    if rope == "features" and fam.name != "wan":
        raise ValueError(f"rope='features' is for Wan models (they have RoPE); this is a {fam.name} model: use rope='none'")
    if fam.name == "wan" and rope == "none" and not cpe_kernel and {"mhla", "linear"} & set(names):
        # Wan has no absolute position embedding: positions reach it only through RoPE in self-attention.
        # A Moving-MNIST model trained this way stalled with blocky samples (docs/RESULTS.md).
        warnings.warn("linear / MHLA layers of a Wan model with rope='none' and cpe_kernel=0 see no token "
                      "positions (Wan's only position signal is the RoPE of its self-attention); for "
                      "training or fine-tuning use rope='features' (the official recipe) or cpe_kernel=3",
                      UserWarning, stacklevel=2)
    if grid is not None:
        grid = tuple(int(g) for g in grid)
        if len(grid) != fam.ndim:
            raise ValueError(f"grid={grid} must have {fam.ndim} axes for a {fam.base.__name__}")
    if "mhla" in names:
        grid = grid or fam.default_grid(model)
        if blocks is None:
            if grid is None:
                raise ValueError(
                    f"blocks=None needs grid=(frames, height, width) in tokens to choose blocks for a "
                    f"{fam.base.__name__}, e.g. grid=(21, 30, 52) for 81 frames at 480x832; or give blocks"
                )
            blocks = auto_blocks(grid)
        blocks = [int(b) for b in blocks]
        if len(blocks) != fam.ndim:
            raise ValueError(f"blocks={blocks} must have {fam.ndim} counts (one per grid axis) for a "
                             f"{fam.base.__name__}")
        if grid is not None:
            check_grid_blocks(grid, tuple(blocks))
    spec = AttentionSpec(layers=names, blocks=list(blocks) if "mhla" in names else None, feature_map=feature_map,
                         normalize=normalize, eps=eps, scale=scale, per_head_mix=per_head_mix, out_norm=out_norm,
                         out_gate=out_gate, cpe_kernel=cpe_kernel, rope=rope)
    model.__class__ = converted_class_for(model)
    apply_attention(model, spec)
    model.register_to_config(**{CONFIG_KEY: spec.to_dict()})
    return model


def attention_spec_of(model) -> AttentionSpec | None:
    """The spec a converted model was built with (None for an unconverted model)."""
    d = getattr(model, "config", {}).get(CONFIG_KEY)
    return None if d is None else AttentionSpec.from_dict(dict(d))

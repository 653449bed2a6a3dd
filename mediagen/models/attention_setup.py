"""Put the processors an ``AttentionSpec`` asks for into a model's self-attention layers."""

from __future__ import annotations

from .attention_spec import AttentionSpec
from .families import family_of
from .latent_grid import install_grid_hook


def apply_attention(model, spec: AttentionSpec) -> None:
    """Set every self-attention layer's processor; cross-attention is left as it is.

    ``sdpa`` layers get the family's stock processor back (so a converted model with all layers
    ``sdpa`` computes exactly what the original did); ``mhla``/``linear`` layers get a fresh
    processor with Mc at its locality init, whose weights ``from_pretrained`` then loads.
    """
    fam = family_of(model)
    attns = fam.self_attentions(model)
    if len(spec.layers) != len(attns):
        raise ValueError(f"the attention spec lists {len(spec.layers)} layers but the model has {len(attns)}")
    grids = install_grid_hook(model, fam.grid_of)
    for attn, kind in zip(attns, spec.layers):
        if kind == "sdpa":
            if not isinstance(attn.processor, fam.stock_processor):
                attn.set_processor(fam.stock_processor())
            continue
        ref = attn.to_q.weight
        proc = fam.processor(kind, spec, heads=attn.heads, head_dim=attn.to_q.out_features // attn.heads,
                             query_dim=attn.to_q.in_features, ndim=fam.ndim, grids=grids)
        proc.to(device=ref.device, dtype=ref.dtype)  # new weights follow the layer's device and dtype
        attn.set_processor(proc)

"""Put the processors an ``AttentionSpec`` asks for into a model's self-attention layers."""

from __future__ import annotations

from typing import Collection

from . import attention_registry as registry
from .attention_spec import AttentionSpec
from .families import family_of
from .latent_grid import install_grid_hook
from .processors import GridSelfAttnProcessor


def apply_attention(model, spec: AttentionSpec, keep: Collection[int] = (), carry: Collection[int] = ()) -> None:
    """Set the self-attention layers' processors as ``spec`` says; cross-attention is left as it is.

    Layers whose entry is ``None`` and layers listed in ``keep`` are not touched: they keep exactly
    the processor they have (the family's own one for a fresh model, e.g. SANA's ReLU linear attention,
    or one the user set, or a converted processor with trained weights). Layers of a stock attention
    (``sdpa``) get the family's stock softmax processor (so a converted model with all layers ``sdpa``
    computes exactly what the original did); the others get a fresh processor around their attention's
    core (``mhla``: Mc at its locality init), whose weights ``from_pretrained`` then loads. Layers listed
    in ``carry`` get a fresh processor that takes over every weight of the one they have; only parameters
    the old one lacks (a CPE being added) keep their zero init, so the layer computes what it computed before.
    """
    fam = family_of(model)
    attns = fam.self_attentions(model)
    if len(spec.layers) != len(attns):
        raise ValueError(f"the attention spec lists {len(spec.layers)} layers but the model has {len(attns)}")
    check_head_dims(model, spec)
    grids = install_grid_hook(model, fam.grid_of)
    for i, (attn, kind) in enumerate(zip(attns, spec.layers)):
        if kind is None or i in keep:
            continue
        if registry.get(kind).stock:
            if not isinstance(attn.processor, fam.stock_processor):
                attn.set_processor(fam.stock_processor())
            continue
        ref = attn.to_q.weight
        proc = fam.processor(kind, spec, heads=attn.heads, head_dim=head_dim(attn),
                             query_dim=attn.to_q.in_features, ndim=fam.ndim, grids=grids)
        proc.to(device=ref.device, dtype=ref.dtype)  # new weights follow the layer's device and dtype
        if i in carry:
            missing, unexpected = proc.load_state_dict(attn.processor.state_dict(), strict=False)
            if unexpected or any(not k.startswith("cpe.") for k in missing):
                raise ValueError(f"layer {i}: cannot carry the weights over to the new processor (missing "
                                 f"{missing}, unexpected {unexpected})")
        attn.set_processor(proc)


def layers_in_use(model, layers: list) -> list:
    """The spec's layer entries (``layers``) as the model's self-attention layers run now, for saving.

    A layer recorded as linear / MHLA whose processor was replaced since (diffusers' ``set_attn_processor`` /
    ``set_processor``) holds none of that attention's weights; recorded as it was, it would load back as a
    fresh linear / MHLA layer. It is saved as "sdpa" when it runs the family's stock softmax processor, else
    as None (it loads with the model's own processor: diffusers saves no processor). A layer running a
    linear / MHLA processor that its entry does not record cannot be saved so that it loads as it runs
    (the options its weights were built with are not known): that raises.
    """
    fam = family_of(model)
    out = list(layers)
    for i, (attn, kind) in enumerate(zip(fam.self_attentions(model), layers)):
        proc = attn.processor
        if isinstance(proc, GridSelfAttnProcessor):
            if proc.kind != kind:
                raise ValueError(f"layer {i} runs a {proc.kind!r} processor but config.mediagen_attention records "
                                 f"{kind!r}, so the saved model would not load as it runs: a linear / MHLA processor "
                                 f"saves only in a layer that mediagen.convert gave it")
        elif kind in registry.converted_names():
            out[i] = "sdpa" if isinstance(proc, fam.stock_processor) else None
    return out


def head_dim(attn) -> int:
    return attn.to_q.out_features // attn.heads


def check_head_dims(model, spec: AttentionSpec) -> None:
    """Layers whose attention runs on kernels with a head-dim range (linear / MHLA: the MHLA kernels, 16 to
    256; the entry's ``head_dims``): refuse others at conversion time rather than at the first forward."""
    attns = family_of(model).self_attentions(model)
    for i, (attn, kind) in enumerate(zip(attns, spec.layers)):
        entry = registry.get(kind) if kind is not None else None
        if entry is None or entry.head_dims is None:
            continue
        (lo, hi), d = entry.head_dims(), head_dim(attn)
        if not lo <= d <= hi:
            raise ValueError(f"layer {i} has head dim {d} ({attn.heads} heads): attention={kind!r} needs a head "
                             f"dim from {lo} to {hi}; keep that layer 'sdpa' or not converted")

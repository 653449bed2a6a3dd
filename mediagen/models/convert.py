"""``mediagen.convert``: swap the self-attention of a diffusers transformer for MHLA, in place."""

from __future__ import annotations

import contextlib
import warnings
from typing import Sequence

from ..kernels.mhla.layout import check_grid_blocks
from . import attention_registry as registry
from .attention_setup import apply_attention, check_head_dims
from .attention_spec import AttentionSpec, auto_blocks, is_int, layer_attentions
from .converted import CONFIG_KEY, converted_class_for
from .families import family_of
from .processors import GridSelfAttnProcessor


def convert(model, attention: str | Sequence[str | None] = "mhla", *, layers: Sequence[int] | None = None,
            grid: Sequence[int] | None = None, reinit: bool = False, **options):
    """Convert a ``WanTransformer3DModel`` / ``DiTTransformer2DModel`` / ``SanaTransformer2DModel`` (or
    a pipeline's ``.transformer``) in place and return it.

    Every pretrained weight is kept; only Mc (and the optional out-norm, gate and CPE weights) are
    new. The result saves and loads with ``save_pretrained``/``from_pretrained`` and comes back
    converted. A call that raises leaves the model (or pipeline) as it was.

    Args:
        attention: the name of a registered attention ("sdpa", "linear", "mhla"; ``models.attention_registry``),
            a pattern ("wan-mhla-h": softmax every third layer, MHLA in the rest), or a list with one
            registered name per layer (None: leave that layer).
        layers: with a single name, the layer indices that get it; the other layers keep exactly the
            processor they have (the model's own attention, or an earlier conversion).
        grid: the token grid the model will mostly run at, used to choose and check ``blocks``.
        reinit: allow replacing layers that are already linear / MHLA by a different attention or
            different options; their Mc (and other new weights) start again from the init.
        **options: the registered attentions' options (``OPTION_NAMES``; each attention's options dataclass
            says what they mean): for linear / MHLA blocks, feature_map, normalize, eps, scale, per_head_mix,
            out_norm, out_gate, cpe_kernel, rope, and the official MHLA code's conventions denominator,
            feature_eps, mix_init, in_norm (denominator="official" runs the numerator through the kernels and
            the division in plain PyTorch ops: slower, and only for blocks that divide the grid). ``blocks``
            is the block count per grid axis ((F, H, W) for Wan, (H, W) for DiT and SANA); when not given it is
            chosen from ``grid`` (or DiT's / SANA's sample_size) with M^2 <= N. Options not given (and
            ``blocks=None``) keep the values of an earlier conversion of the model, else take the
            defaults of their dataclasses, except ``rope``: "features" for a Wan model (its RoPE, the only
            position signal it has, rotates the linear / MHLA layers' features), "none" for the others.

    Converting again is safe: layers asked for with the attention and options they already have keep
    their processor and trained weights; adding a CPE (``cpe_kernel`` where it was 0, nothing else
    changed) keeps every trained weight and, the CPE being zero-initialised, the model's output;
    asking a linear / MHLA layer for anything else raises unless ``reinit=True``. The options are shared by all linear / MHLA layers, so new options cannot
    be given while layers not named here are linear / MHLA with other options.

    The official Wan2.1 MHLA layer is ``mediagen.models.official.official_options("wan", gated=True)``
    (rope="features", out_norm="per_head", out_gate=True, feature_eps=1e-6, normalize=False; its hybrid is
    ``attention="wan-mhla-h"``); ``mediagen.models.official.load_official_state_dict`` loads its checkpoints.
    Softmax layers keep the stock processor; to force FlashAttention there use diffusers'
    ``model.set_attention_backend("flash")`` (Wan). SANA's own self-attention is ReLU linear
    attention: ``attention="linear", eps=1e-15`` reproduces it, "mhla" is the paper's SANA-MHLA, and
    "sdpa" gives softmax layers (not what SANA was trained with). Mc stays in [0, 1] during training with
    ``mediagen.attention.register_mix_clipping(optimizer, model)``.
    """
    model = getattr(model, "_orig_mod", model)  # a torch.compile wrapper: convert what it wraps
    option_names = registry.option_names()
    unknown = sorted(set(options) - set(option_names))
    if unknown:
        raise TypeError(f"convert() got unknown option(s) {unknown}; allowed: layers, grid, reinit and the "
                        f"attentions' options {list(option_names)}")
    if not isinstance(reinit, bool):
        raise ValueError(f"reinit={reinit!r} is not allowed: use True or False")
    # All or nothing: every model is checked before any is changed, and an error while changing them
    # (one layer's processor, one of a pipeline's transformers) puts back what was changed before it, so a
    # failed call leaves the model or pipeline exactly as it was.
    if hasattr(model, "components") and hasattr(model, "register_modules"):  # a DiffusionPipeline
        names = [n for n in ("transformer", "transformer_2") if getattr(model, n, None) is not None]
        if not names:
            raise ValueError("the pipeline has no .transformer to convert")
        targets = [getattr(getattr(model, n), "_orig_mod", getattr(model, n)) for n in names]
        plans = [_plan(t, attention, layers, grid, reinit, dict(options)) for t in targets]
        with _restored_on_error(targets, pipeline=model):
            for name, target, plan in zip(names, targets, plans):
                _apply(target, *plan)
                model.register_modules(**{name: getattr(model, name)})  # record the new class in model_index
        return model
    plan = _plan(model, attention, layers, grid, reinit, options)
    with _restored_on_error([model]):
        _apply(model, *plan)
    return model


def _plan(model, attention, layers, grid, reinit: bool, options: dict) -> tuple:
    """Check a conversion of one transformer without changing it: (spec, layers to keep, layers to carry)."""
    fam = family_of(model)
    num_layers = len(fam.self_attentions(model))
    asked = layer_attentions(attention, num_layers, layers)
    if all(a is None for a in asked):
        raise ValueError("attention names no layer (every entry is None), so nothing would be converted")
    if "blocks" in options and options["blocks"] is None:
        del options["blocks"]  # None asks for the default: the blocks of existing MHLA layers, else from the grid
    old = attention_spec_of(model)
    if old is not None and len(old.layers) != num_layers:
        raise ValueError(f"config.{CONFIG_KEY} lists {len(old.layers)} layers but the model has {num_layers}")
    old_layers = old.layers if old is not None else [None] * num_layers
    if old is not None:
        # A named layer recorded as linear / MHLA whose processor has since been replaced (diffusers'
        # set_attn_processor / set_processor) holds none of that attention's weights: it converts as a fresh
        # layer, neither kept as recorded (the model would go on running the other processor) nor refused as
        # if converting it again would lose trained weights.
        attns = fam.self_attentions(model)
        for i, kind in enumerate(old.layers):
            if asked[i] is not None and kind in registry.converted_names() and not _has_processor_of(attns[i], kind):
                old.layers[i] = None
    names = [a if a is not None else o for a, o in zip(asked, old_layers)]
    opts = dict(old.options() if old is not None else registry.option_defaults(), **options)
    if old is None and "rope" not in options and fam.name == "wan":
        # Wan has no position embedding: the RoPE of its self-attention is its only position signal, so a
        # first conversion keeps it on the linear / MHLA layers' features unless rope="none" is asked for
        opts["rope"] = "features"
    # the attentions whose layers get a core of their own (the others keep the family's softmax processor)
    converts = [n for n in dict.fromkeys(names) if n is not None and not registry.get(n).stock]
    if opts["rope"] == "features" and fam.name != "wan":
        raise ValueError(f"rope='features' is for Wan models (they have RoPE); this is a {fam.name} model: use rope='none'")
    no_rope = [n for n in converts if not registry.get(n).rope]
    if opts["rope"] == "features" and no_rope:
        raise ValueError(f"rope='features' is for attentions that take the model's rotary tables; {no_rope[0]!r} does "
                         f"not: use rope='none' (cpe_kernel=3 gives its layers positions)")
    if fam.name == "wan" and opts["rope"] == "none" and not opts["cpe_kernel"] and converts:
        # Wan has no absolute position embedding: positions reach it only through RoPE in self-attention.
        # A Moving-MNIST model trained this way stalled with blocky samples (docs/RESULTS.md).
        warnings.warn("linear / MHLA layers of a Wan model with rope='none' and cpe_kernel=0 see no token "
                      "positions (Wan's only position signal is the RoPE of its self-attention); for "
                      "training or fine-tuning use rope='features' (the official recipe) or cpe_kernel=3",
                      UserWarning, stacklevel=3)
    if grid is not None:
        if isinstance(grid, (str, bytes)) or not hasattr(grid, "__iter__") or len(tuple(grid)) != fam.ndim \
                or not all(is_int(g) and g >= 1 for g in grid):
            raise ValueError(f"grid={grid!r} is not allowed: give {fam.ndim} positive ints (tokens per axis) for a "
                             f"{fam.base.__name__}")
        grid = tuple(int(g) for g in grid)
    if any(registry.get(n).blocks for n in converts):
        grid = grid or fam.default_grid(model)
        if opts["blocks"] is None:
            if grid is None:
                raise ValueError(
                    f"blocks=None needs grid=(frames, height, width) in tokens to choose blocks for a "
                    f"{fam.base.__name__}, e.g. grid=(21, 30, 52) for 81 frames at 480x832; or give blocks"
                )
            opts["blocks"] = auto_blocks(grid)
    elif "blocks" in opts:
        opts["blocks"] = None  # only attentions with blocks use them; the config does not keep an unused value
    spec = AttentionSpec(layers=names, **opts)  # checks every option's value
    if getattr(spec, "blocks", None) is not None:
        if len(spec.blocks) != fam.ndim:
            raise ValueError(f"blocks={spec.blocks} must have {fam.ndim} counts (one per grid axis) for a "
                             f"{fam.base.__name__}")
        if grid is not None:
            check_grid_blocks(grid, tuple(spec.blocks))
    if grid is not None:
        spec.check_grid(grid)
    if isinstance(spec.cpe_kernel, list) and len(spec.cpe_kernel) != fam.ndim:
        raise ValueError(f"cpe_kernel={spec.cpe_kernel} must have {fam.ndim} sizes (one per grid axis) for a "
                         f"{fam.base.__name__}, or be one int")
    check_head_dims(model, spec)
    keep, carry = _layers_to_keep(old, spec, asked, reinit)
    converted_class_for(model)  # refuses a class that has no converted counterpart
    return spec, keep, carry


def _apply(model, spec: AttentionSpec, keep: set[int], carry: set[int]) -> None:
    model.__class__ = converted_class_for(model)
    apply_attention(model, spec, keep=keep, carry=carry)
    model.register_to_config(**{CONFIG_KEY: spec.to_dict()})


@contextlib.contextmanager
def _restored_on_error(models: list, pipeline=None):
    """On an error in the block, give ``models`` back their class, config, self-attention processors (the
    same objects, so their weights too) and forward pre-hooks (the grid hook), and ``pipeline`` its config
    (model_index), as they were on entry; then re-raise."""
    saved = [(m, m.__class__, m._internal_dict, [(a, a.processor) for a in family_of(m).self_attentions(m)],
              m.__dict__.get("_mediagen_grids"), dict(m._forward_pre_hooks), dict(m._forward_pre_hooks_with_kwargs))
             for m in models]
    pipeline_config = getattr(pipeline, "_internal_dict", None)
    try:
        yield
    except BaseException:
        for m, cls, config, procs, grids, hooks, hooks_with_kwargs in saved:
            m.__class__ = cls
            m._internal_dict = config
            for attn, proc in procs:
                attn.set_processor(proc)
            if grids is None:
                m.__dict__.pop("_mediagen_grids", None)
            else:
                m.__dict__["_mediagen_grids"] = grids
            for now, before in ((m._forward_pre_hooks, hooks), (m._forward_pre_hooks_with_kwargs, hooks_with_kwargs)):
                now.clear()
                now.update(before)
        if pipeline is not None:
            pipeline._internal_dict = pipeline_config
        raise


def _has_processor_of(attn, kind: str) -> bool:
    """Whether a self-attention layer runs the processor a conversion to ``kind`` gave it."""
    return isinstance(attn.processor, GridSelfAttnProcessor) and attn.processor.kind == kind


def _adds_cpe_only(old: AttentionSpec, new: AttentionSpec, i: int) -> bool:
    """Layer i keeps its attention and options except for a CPE that it did not have: the new term is
    zero-initialised, so the layer's trained weights carry over and its output is unchanged."""
    if old.layers[i] != new.layers[i] or new.layers[i] not in registry.converted_names():
        return False
    a, b = old.layer_setup(i)[1], new.layer_setup(i)[1]
    return a["cpe_kernel"] == 0 and b["cpe_kernel"] != 0 and {k for k in a if a[k] != b[k]} == {"cpe_kernel"}


def _layers_to_keep(old: AttentionSpec | None, new: AttentionSpec, asked: list,
                    reinit: bool) -> tuple[set[int], set[int]]:
    """(layers whose processor stays as it is, layers that only gain a CPE and carry their weights
    over); raise where a linear / MHLA layer (which may hold trained weights) would be rebuilt without
    ``reinit=True``, or would change without being named at all."""
    if old is None:
        return set(), set()
    keep, carry, named, unnamed = set(), set(), [], []
    for i in range(len(new.layers)):
        if old.layer_setup(i) == new.layer_setup(i):
            keep.add(i)
        elif _adds_cpe_only(old, new, i) and not reinit:
            carry.add(i)
        elif old.layers[i] in registry.converted_names():
            (named if asked[i] is not None else unnamed).append(i)
    if unnamed:
        i = unnamed[0]
        raise ValueError(f"layers {unnamed} are {old.layers[i]!r} layers that this call leaves as they are, but the "
                         f"options it asks differ from theirs ({_option_diff(old, new, i)}); options are shared by "
                         f"all linear / MHLA layers: keep their options, or name those layers too with reinit=True")
    if named and not reinit:
        i = named[0]
        diff = _option_diff(old, new, i)
        was = f"{old.layers[i]!r}" + (f" with {diff}" if diff else "")
        raise ValueError(f"layers {named} are already converted (layer {i}: {was}, asked {new.layers[i]!r}); "
                         f"converting them again would replace their trained weights: pass reinit=True to "
                         f"re-initialise them on purpose, or leave them out of layers")
    return keep, carry


def _option_diff(old: AttentionSpec, new: AttentionSpec, i: int) -> str:
    if old.layers[i] != new.layers[i] or new.layers[i] not in registry.converted_names():
        return ""
    a, b = old.layer_setup(i)[1], new.layer_setup(i)[1]
    return ", ".join(f"{k}={a[k]!r} (asked {b[k]!r})" for k in a if a[k] != b[k])


def attention_spec_of(model) -> AttentionSpec | None:
    """The spec a converted model was built with (None for an unconverted model)."""
    model = getattr(model, "_orig_mod", model)
    d = getattr(model, "config", {}).get(CONFIG_KEY)
    return None if d is None else AttentionSpec.from_dict(dict(d))

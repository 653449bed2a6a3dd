"""Load checkpoints of the official MHLA code (github DAGroup-PKU/MHLA) into a converted diffusers model.

``load_official_state_dict(model, state_dict)`` takes a diffusers ``WanTransformer3DModel`` or
``DiTTransformer2DModel`` of the official model's size, converts it with the options that reproduce the
official layer (``official_options``), renames the official parameters to the converted model's and loads
them. Every parameter must find its place and every place must be filled: anything else is a one-line
error naming the parameters. ``state_dict`` is a dict of tensors or a ``.safetensors`` path; nothing is
unpickled (the official training code saves ``.pth`` files, pickles: turn one into safetensors once where
you trust it, e.g. ``torch.load(path, weights_only=True)["state_dict"]`` then ``safetensors.torch.save_file``).

What each official layer becomes (docs/DESIGN.md#conventions-ours-and-the-official-codes):

- **Wan** (``MHLA_Video_Uni``, the layer the published Wan configs train; softmax layers are Wan's own
  ``WanSelfAttention``): the original Wan parameter names (``blocks.{i}.self_attn.q``, ``cross_attn``,
  ``ffn.0``, ``modulation``, ``head.head`` ...) as diffusers names them, and per MHLA layer
  ``block_attn.conv.weight`` -> Mc, ``g`` -> ``out_gate`` (the SiLU gate), ``g_norm`` -> the per-head
  ``out_norm``, ``lepe`` -> ``cpe``. Options: rope="features", feature_eps=eps, out_norm="per_head",
  out_gate when the layer is gated, cpe_kernel when it has a LePE, and normalize from the training config's
  ``norm_output`` (False in the published configs; True takes the official denominator).
- **DiT** (``MHLA4DiT`` in ``DiT_MHLA``): the facebookresearch DiT names (``x_embedder``, ``t_embedder``,
  ``y_embedder``, ``blocks.{i}.adaLN_modulation``, ``mlp.fc1`` ...) as diffusers' DiT names them, and per
  layer ``to_qkv`` -> to_q / to_k / to_v, ``norm`` -> ``in_norm``, ``lepe`` -> ``cpe`` (3x3),
  ``piece_attn.conv.weight`` -> Mc. Options: denominator="official", feature_eps=eps, in_norm, cpe_kernel=3.
  diffusers' DiT computes its timestep sinusoid at frequencies exp(-ln(1e4) k / (half - 1)), the official
  (facebookresearch's) DiT at exp(-ln(1e4) k / half); the loader sets the official one on the model
  (``use_official_timesteps``), which diffusers' config does not record: after ``from_pretrained`` of a saved
  copy call ``use_official_timesteps(model)`` again.

The official Mc (a 1x1 convolution over blocks, weight (M, M, 1, 1)) mixes summaries as ours does: row i is
what query block i reads, so it loads as it is.
"""

from __future__ import annotations

import math
import os
import re
from typing import Mapping, Sequence

import torch

from .convert import convert
from .families import family_of

# The official Wan model builds every MHLA layer with this block layout (WanAttentionBlock's default: the
# model does not pass its own ``block_layout`` on).
OFFICIAL_WAN_BLOCKS = (3, 5, 10)

# Original Wan names -> diffusers' WanTransformer3DModel names, per parameter path (after "blocks.{i}." for
# the per-block ones). The official model keeps the original Wan module names.
_WAN_TOP = {
    "patch_embedding": "patch_embedding",
    "text_embedding.0": "condition_embedder.text_embedder.linear_1",
    "text_embedding.2": "condition_embedder.text_embedder.linear_2",
    "time_embedding.0": "condition_embedder.time_embedder.linear_1",
    "time_embedding.2": "condition_embedder.time_embedder.linear_2",
    "time_projection.1": "condition_embedder.time_proj",
    "head.head": "proj_out",
}
_WAN_ATTENTION = {"q": "to_q", "k": "to_k", "v": "to_v", "o": "to_out.0", "norm_q": "norm_q", "norm_k": "norm_k"}
_WAN_BLOCK = {
    "norm3": "norm2",   # the cross-attention's input norm: norm3 in Wan, norm2 in diffusers
    "ffn.0": "ffn.net.0.proj",
    "ffn.2": "ffn.net.2",
}
# The official MHLA layer's own parameters -> our processor's (under blocks.{i}.attn1.processor.)
_WAN_MHLA = {"g": "out_gate", "g_norm": "out_norm", "lepe": "cpe"}

_DIT_TOP = {
    "x_embedder.proj": "pos_embed.proj",
    "final_layer.linear": "proj_out_2",
    "final_layer.adaLN_modulation.1": "proj_out_1",
}
_DIT_BLOCK = {
    "adaLN_modulation.1": "norm1.linear",
    "mlp.fc1": "ff.net.0.proj",
    "mlp.fc2": "ff.net.2",
    "attn.to_out.0": "attn1.to_out.0",
    "attn.norm": "attn1.processor.in_norm",
    "attn.lepe": "attn1.processor.cpe",
}
_SHOWN = 4  # names quoted in an error about many parameters


def read_state_dict(state_dict) -> dict[str, torch.Tensor]:
    """A dict of tensors as given, or the tensors of a ``.safetensors`` file (never a pickle)."""
    if isinstance(state_dict, (str, os.PathLike)):
        path = os.fspath(state_dict)
        if not path.endswith(".safetensors"):
            raise ValueError(f"state_dict={path!r} is not allowed: give a .safetensors file or a dict of tensors "
                             f"(a .pth checkpoint is a pickle, which mediagen does not open)")
        if not os.path.isfile(path):
            raise ValueError(f"state_dict={path!r} does not exist: give the path of the official checkpoint "
                             f"saved as safetensors")
        from safetensors.torch import load_file

        return load_file(path)
    if not isinstance(state_dict, Mapping):
        raise ValueError(f"state_dict of type {type(state_dict).__name__} is not allowed: give a dict of tensors "
                         f"or a .safetensors path")
    sd = dict(state_dict)
    for key in ("state_dict", "state_dict_ema", "model"):
        if isinstance(sd.get(key), Mapping):
            raise ValueError(f"state_dict holds a nested {key!r} dict (a training checkpoint): pass "
                             f"checkpoint[{key!r}] itself")
    bad = [k for k, v in sd.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise ValueError(f"state_dict[{bad[0]!r}] is a {type(sd[bad[0]]).__name__}, not a tensor: give a dict of "
                         f"tensors")
    for prefix in ("module.", "model.diffusion_model."):  # a DDP wrapper's or a single-file checkpoint's prefix
        if sd and all(k.startswith(prefix) for k in sd):
            sd = {k[len(prefix):]: v for k, v in sd.items()}
    return sd


def official_options(family: str, *, gated: bool = False, lepe: int | Sequence[int] = 0,
                     norm_output: bool = False, eps: float = 1e-6) -> dict:
    """The ``mediagen.convert`` options that reproduce an official MHLA layer (``family``: "wan" or "dit").

    Wan: ``gated`` (``is_gated``), ``lepe`` (0, or the LePE's kernel size: ``is_lepe``), ``norm_output`` (the
    training config's, False in the published configs). DiT: the layer always normalises and has a LePE.
    ``eps``: the layer's eps, which the official code uses both in phi(x) = relu(x) + eps and in the
    denominator."""
    lepe = lepe if isinstance(lepe, int) else list(lepe)
    common = dict(feature_map="relu", feature_eps=eps, eps=eps, mix_init="official", per_head_mix=False)
    if family == "wan":
        return dict(common, rope="features", normalize=norm_output,
                    denominator="official" if norm_output else "paper", scale=None, out_norm="per_head",
                    out_gate=gated, cpe_kernel=lepe, in_norm=False)
    if family == "dit":
        return dict(common, rope="none", normalize=True, denominator="official", scale=None, out_norm=False,
                    out_gate=False, cpe_kernel=lepe or 3, in_norm=True)
    raise ValueError(f"family={family!r} is not allowed: the official MHLA code has 'wan' and 'dit' models")


def load_official_state_dict(model, state_dict, *, blocks: Sequence[int] | None = None,
                             norm_output: bool | None = None, eps: float = 1e-6):
    """Convert ``model`` (a diffusers Wan / DiT transformer of the official model's size, or a pipeline
    holding one) into the official MHLA model whose parameters ``state_dict`` holds, in place; return it.

    Args:
        state_dict: the official model's parameters, names as its modules name them (a dict of tensors or a
            ``.safetensors`` path).
        blocks: the block layout. Wan: (F, H, W) counts, default (3, 5, 10), the only layout the official Wan
            model builds. DiT: default (s, s) with s^2 the checkpoint's block count (the official DiT cuts a
            square grid into square blocks).
        norm_output: Wan only: the official training config's ``norm_output`` (default False, as in the
            published configs: no denominator). DiT always normalises.
        eps: the official layer's eps (1e-6 in the published code): phi(x) = relu(x) + eps, and the
            denominator's eps.

    With a denominator (DiT; Wan with norm_output=True) the layers run the official denominator, which the
    MHLA kernels do not compute: the numerator comes from the kernels and the division from plain PyTorch
    ops (``mediagen.attention.mhla.mhla_attend``), and every block count must divide its grid axis, as in the
    official code. Without one (the published Wan recipe) the layers run the kernels alone.
    """
    if hasattr(model, "components") and hasattr(model, "register_modules"):  # a DiffusionPipeline
        if getattr(model, "transformer", None) is None:
            raise ValueError("the pipeline has no .transformer to load the official checkpoint into")
        load_official_state_dict(model.transformer, state_dict, blocks=blocks, norm_output=norm_output, eps=eps)
        model.register_modules(transformer=model.transformer)
        return model
    if not (isinstance(eps, (int, float)) and not isinstance(eps, bool) and math.isfinite(eps) and eps > 0):
        raise ValueError(f"eps={eps!r} is not allowed: use the official layer's eps, a finite number > 0 (1e-6)")
    fam = family_of(model)
    sd = read_state_dict(state_dict)
    if fam.name == "wan":
        if norm_output is None:
            norm_output = False
        if not isinstance(norm_output, bool):
            raise ValueError(f"norm_output={norm_output!r} is not allowed: use True or False (the official config's "
                             f"norm_output)")
        mapped, options, names = _wan(model, sd, blocks, norm_output, eps)
    elif fam.name == "dit":
        if norm_output not in (None, True):
            raise ValueError(f"norm_output={norm_output!r} is not allowed for a DiT: the official DiT layer always "
                             f"normalises (leave it None)")
        mapped, options, names = _dit(model, sd, blocks, eps)
    else:
        raise ValueError(f"a {type(model).__name__} has no official MHLA checkpoint: the official code has Wan and "
                         f"DiT models")
    convert(model, names, reinit=True, **options)
    extra = mapped.pop(_POS_EMBED, None)
    _load_exactly(model, mapped)
    if fam.name == "dit":
        _check_pos_embed(model, extra)
        use_official_timesteps(model)
    return model


def use_official_timesteps(model) -> None:
    """Make a diffusers DiT compute the official (facebookresearch) DiT's timestep sinusoid,
    exp(-ln(1e4) k / half) for k < half, where diffusers' DiT takes k / (half - 1). In memory only: diffusers'
    config does not record it, so call this again after loading a saved copy."""
    model = getattr(model, "transformer", model)
    if family_of(model).name != "dit":
        raise ValueError(f"use_official_timesteps is for DiT models; got a {type(model).__name__}")
    for block in model.transformer_blocks:
        block.norm1.emb.time_proj.downscale_freq_shift = 0


_POS_EMBED = "\0pos_embed"  # the official DiT's fixed sin-cos table: checked against the model's, not loaded


def _layer_ids(sd, pattern: str) -> set[int]:
    rx = re.compile(pattern)
    return {int(m.group(1)) for k in sd for m in [rx.fullmatch(k)] if m}


def _check_blocks(blocks, M: int, default, ndim: int, what: str) -> tuple[int, ...]:
    if blocks is None:
        blocks = default
    seq = None if isinstance(blocks, (str, bytes)) or not hasattr(blocks, "__iter__") else list(blocks)
    if seq is None or len(seq) != ndim or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1
                                                  for b in seq):
        raise ValueError(f"blocks={blocks!r} is not allowed: give {ndim} positive ints, the official {what}")
    if math.prod(seq) != M:
        raise ValueError(f"blocks={tuple(seq)} makes {math.prod(seq)} blocks but the checkpoint's Mc is {M} x {M}: "
                         f"give the official {what}")
    return tuple(seq)


def _one_value(per_layer: dict, name: str):
    """The one value every MHLA layer has for ``name`` (our options are shared by all layers)."""
    values = set(per_layer.values())
    if len(values) > 1:
        raise ValueError(f"the checkpoint's MHLA layers differ in {name} ({per_layer}); mediagen's layers share one "
                         f"set of options")
    return values.pop()


def _lepe_kernel(sd, key: str, ndim: int) -> int | tuple[int, ...]:
    """0 without a LePE, else its kernel size: one int when equal on every axis, else a tuple (hashable for
    ``_one_value``; ``official_options`` takes either)."""
    if key not in sd:
        return 0
    sizes = tuple(int(s) for s in sd[key].shape[2:])
    if len(sizes) != ndim or any(s % 2 == 0 for s in sizes):
        raise ValueError(f"{key} has shape {tuple(sd[key].shape)}: a depthwise convolution with odd kernel sizes "
                         f"over the {ndim}-axis grid was expected")
    return sizes[0] if len(set(sizes)) == 1 else sizes


def _wan(model, sd, blocks, norm_output, eps):
    L = len(model.blocks)
    mhla = _layer_ids(sd, r"blocks\.(\d+)\.self_attn\.block_attn\.conv\.weight")
    if not mhla:
        raise ValueError("the checkpoint has no MHLA layer (no blocks.{i}.self_attn.block_attn.conv.weight): it is "
                         "not an official Wan MHLA checkpoint")
    if max(mhla) >= L:
        raise ValueError(f"the checkpoint has MHLA layers up to blocks.{max(mhla)} but the model has {L} blocks: "
                         f"build the model with the official model's num_layers")
    M = _one_value({i: sd[f"blocks.{i}.self_attn.block_attn.conv.weight"].shape[0] for i in mhla}, "block count")
    gated = _one_value({i: f"blocks.{i}.self_attn.g.weight" in sd for i in mhla}, "gating (is_gated)")
    lepe = _one_value({i: _lepe_kernel(sd, f"blocks.{i}.self_attn.lepe.weight", 3) for i in mhla}, "LePE (is_lepe)")
    blocks = _check_blocks(blocks, M, OFFICIAL_WAN_BLOCKS, 3, "Wan block_layout (F, H, W)")
    options = official_options("wan", gated=gated, lepe=lepe, norm_output=norm_output, eps=eps)
    names = ["mhla" if i in mhla else "sdpa" for i in range(L)]

    mapped = {}
    for key, value in sd.items():
        mapped[_wan_name(key, mhla)] = value
    for i in mhla:
        mix = f"blocks.{i}.attn1.processor.core.mix"
        mapped[mix] = mapped[mix].reshape(M, M)
    return mapped, dict(options, blocks=list(blocks)), names


def _wan_name(key: str, mhla: set[int]) -> str:
    for old, new in _WAN_TOP.items():
        if key.startswith(old + "."):
            return new + key[len(old):]
    if key == "head.modulation":
        return "scale_shift_table"
    m = re.fullmatch(r"blocks\.(\d+)\.(.+)", key)
    if m is None:
        return key  # reported as having no place
    i, rest = int(m.group(1)), m.group(2)
    head = f"blocks.{i}."
    if rest == "modulation":
        return head + "scale_shift_table"
    for old, new in _WAN_BLOCK.items():
        if rest.startswith(old + "."):
            return head + new + rest[len(old):]
    for attn, ours in (("self_attn.", "attn1."), ("cross_attn.", "attn2.")):
        if not rest.startswith(attn):
            continue
        module, _, param = rest[len(attn):].rpartition(".")
        if module in _WAN_ATTENTION:
            return head + ours + _WAN_ATTENTION[module] + "." + param
        if attn == "self_attn." and i in mhla:
            if module == "block_attn.conv" and param == "weight":
                return head + "attn1.processor.core.mix"
            if module in _WAN_MHLA:
                return head + "attn1.processor." + _WAN_MHLA[module] + "." + param
    return key


def _dit(model, sd, blocks, eps):
    L = len(model.transformer_blocks)
    if model.config.norm_eps != 1e-6:
        # diffusers' DiT takes the feed-forward's LayerNorm eps from its config; the official DiT's are all 1e-6
        raise ValueError(f"the model's norm_eps={model.config.norm_eps!r} is not the official DiT's LayerNorm eps: "
                         f"build the DiTTransformer2DModel with norm_eps=1e-6")
    mhla = _layer_ids(sd, r"blocks\.(\d+)\.attn\.piece_attn\.conv\.weight")
    if not mhla:
        raise ValueError("the checkpoint has no MHLA layer (no blocks.{i}.attn.piece_attn.conv.weight): it is not "
                         "an official DiT MHLA checkpoint")
    if mhla != set(range(L)):
        missing = sorted(set(range(L)) - mhla)
        raise ValueError(f"the official DiT_MHLA has an MHLA layer in every block, but the checkpoint has them in "
                         f"{len(mhla)} blocks and the model has {L}" + (f" (none in blocks {missing[:_SHOWN]})"
                                                                       if missing else ""))
    for i in range(L):
        for norm in ("q_norm", "k_norm"):
            if f"blocks.{i}.attn.{norm}.weight" in sd:
                raise ValueError(f"blocks.{i}.attn.{norm}.weight: official DiT layers built with qk_norm=True (an "
                                 f"RMSNorm over all heads' q and k) are not supported")
        if f"blocks.{i}.dw_conv.weight" in sd:
            raise ValueError(f"blocks.{i}.dw_conv.weight: official DiT blocks built with dwconv=True (a depthwise "
                             f"convolution after the block) are not supported")
    M = _one_value({i: sd[f"blocks.{i}.attn.piece_attn.conv.weight"].shape[0] for i in mhla}, "block count")
    side = math.isqrt(M)
    blocks = _check_blocks(blocks, M, (side, side) if side * side == M else None, 2,
                           "DiT blocks per side (rows, columns)")
    lepe = _one_value({i: _lepe_kernel(sd, f"blocks.{i}.attn.lepe.weight", 2) for i in mhla}, "LePE")
    options = official_options("dit", lepe=lepe, eps=eps)

    mapped = {}
    for key, value in sd.items():
        if key == "pos_embed":
            mapped[_POS_EMBED] = value
        elif key.startswith("t_embedder.mlp.") or key.startswith("y_embedder."):
            # one embedder in the official DiT; diffusers' DiT keeps a copy in every block (the first one's
            # is also the final layer's)
            for i in range(L):
                mapped[_dit_embedder_name(key, i)] = value
        elif (m := re.fullmatch(r"blocks\.(\d+)\.attn\.to_qkv\.(weight|bias)", key)) is not None:
            for name, part in zip(("to_q", "to_k", "to_v"), value.chunk(3, dim=0)):
                mapped[f"transformer_blocks.{m.group(1)}.attn1.{name}.{m.group(2)}"] = part
        elif (m := re.fullmatch(r"blocks\.(\d+)\.attn\.piece_attn\.conv\.weight", key)) is not None:
            mapped[f"transformer_blocks.{m.group(1)}.attn1.processor.core.mix"] = value.reshape(M, M)
        else:
            mapped[_dit_name(key)] = value
    return mapped, dict(options, blocks=list(blocks)), ["mhla"] * L


def _dit_embedder_name(key: str, i: int) -> str:
    head = f"transformer_blocks.{i}.norm1.emb."
    if key.startswith("y_embedder."):
        return head + "class_embedder." + key[len("y_embedder."):]
    layer, param = key[len("t_embedder.mlp."):].split(".", 1)
    return head + {"0": "timestep_embedder.linear_1.", "2": "timestep_embedder.linear_2."}.get(layer, "?") + param


def _dit_name(key: str) -> str:
    for old, new in _DIT_TOP.items():
        if key.startswith(old + "."):
            return new + key[len(old):]
    m = re.fullmatch(r"blocks\.(\d+)\.(.+)", key)
    if m is None:
        return key
    for old, new in _DIT_BLOCK.items():
        if m.group(2).startswith(old + "."):
            return f"transformer_blocks.{m.group(1)}.{new}{m.group(2)[len(old):]}"
    return key


def _load_exactly(model, mapped: dict) -> None:
    """Load ``mapped`` into ``model`` when its names and shapes are exactly the model's parameters and
    persistent buffers; otherwise a one-line error naming what has no place and what stays empty."""
    own = model.state_dict()
    unplaced = sorted(k for k in mapped if k not in own)
    empty = sorted(k for k in own if k not in mapped)
    if unplaced or empty:
        parts = []
        if unplaced:
            parts.append(f"{len(unplaced)} checkpoint parameter(s) have no place in the converted model "
                         f"({', '.join(unplaced[:_SHOWN])}{', ...' if len(unplaced) > _SHOWN else ''})")
        if empty:
            parts.append(f"{len(empty)} model parameter(s) get no value ({', '.join(empty[:_SHOWN])}"
                         f"{', ...' if len(empty) > _SHOWN else ''})")
        raise ValueError("the checkpoint does not match this model: " + "; ".join(parts) + ": build the model with "
                         "the official model's config, and give an official MHLA checkpoint of that family")
    for k, v in mapped.items():
        if tuple(v.shape) != tuple(own[k].shape):
            raise ValueError(f"{k}: the checkpoint's shape {tuple(v.shape)} is not the model's {tuple(own[k].shape)}"
                             f": build the model with the official model's config")
    model.load_state_dict(mapped, strict=True)


def _check_pos_embed(model, table) -> None:
    """The official DiT saves its fixed sin-cos position table; diffusers' DiT recomputes the same table (not a
    saved weight). A table that differs means another image size or embedding."""
    if table is None:
        return
    ours = model.pos_embed.pos_embed
    if tuple(table.shape) != tuple(ours.shape) or not torch.allclose(table.to(ours), ours, atol=1e-5, rtol=0):
        raise ValueError(f"pos_embed: the checkpoint's position table {tuple(table.shape)} is not the model's "
                         f"{tuple(ours.shape)} sin-cos table: build the DiT with the official input_size as "
                         f"sample_size and its patch_size")

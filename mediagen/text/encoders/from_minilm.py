"""Initialise a ``MediagenTextEncoder`` from all-MiniLM-L6-v2: copy what maps, factor what does not.

Copied as is: token embeddings (+ the type-0 embedding as ``type_embedding``), absolute positions,
every LayerNorm, the FFNs, and for ``sdpa``/``hla`` the q, k, v and output projections. The embeddings
and FFNs (``minilm_frozen_tensors``) are what distillation with ``train_only="attention"`` leaves
untouched and what a slim checkpoint (``slim.py``) takes from the installed MiniLM instead of storing. HLA's output
RMSNorm gets the per-channel RMS of MiniLM's attention context, so its output has MiniLM's scale.

MLRA has no full-rank K/V: keys and values come from 4 latent heads of d_c/4. On calibration
activations X (the layer's inputs for real tokens of a prompt corpus) we factor [W_k; W_v] X by SVD:
for each group of heads a set of latent heads serves (MLRA-4: all heads, latents 0-3; MLRA-2: first
half latents 0 and 2, second half latents 1 and 3), the top singular directions U give the down-
projection U^T [W_k; W_v] and the up-projections U, split across the group's latents. The RMSNorm of
each latent head divides by its RMS, so the up-projection is multiplied by the mean calibration RMS
over sqrt(4 d / d_c). Key biases are dropped (q.b_k is the same for every key: softmax ignores it);
value biases fold into the output bias (softmax weights sum to 1). V is scaled by 1/branch_scale so
that branches that agree reproduce MiniLM's output. Queries: W_dq = W_q, W_uq = (mean RMS / sqrt(d/d_q))
I with the rope rows zero and a factor sqrt((d_h + d_r) / d_h) for the wider softmax scale.
It is an approximation (causal, low rank, per-branch softmax): distill afterwards (``distill.py``).

Calibration (a MiniLM forward over the prompt corpus, then the SVDs) takes seconds to tens of seconds
on a CPU, and its result depends only on its inputs. With ``cache_dir`` the initialised weights that
are not MiniLM's own tensors are written there as safetensors, named by a sha256 of everything they
depend on (``INIT_VERSION``, the attention, the encoder's config, the calibration prompts and the bytes of
the MiniLM weights file), and read back instead of calibrating again. ``INIT_VERSION`` changes whenever
this mapping changes, so a cache entry is never reused for a different computation.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..attention import HLAttention, MLRAttention, MultiHeadSelfAttention
from .encoder import MediagenTextEncoder
from .minilm import load_minilm, load_minilm_tokenizer, minilm_path
from .prompts import make_prompts

# Names the calibration and mapping code below; change it whenever their results would change.
INIT_VERSION = "minilm-init-1"
CACHE_ENV = "MEDIAGEN_CACHE_DIR"
CALIBRATED = ("mlra2", "mlra4", "hla")          # attentions whose initialisation depends on calibration

log = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    """$MEDIAGEN_CACHE_DIR, else $XDG_CACHE_HOME/mediagen, else ~/.cache/mediagen; then text-encoder-init/."""
    root = os.environ.get(CACHE_ENV)
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = Path(xdg) / "mediagen" if xdg else Path.home() / ".cache" / "mediagen"
    return Path(root) / "text-encoder-init"


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def init_cache_key(attention: str, model_config: dict, prompts: list[str]) -> str:
    """sha256 of what the initialised weights depend on (see the module docstring)."""
    h = hashlib.sha256()
    config = {k: v for k, v in model_config.items() if not k.startswith("_")}
    h.update(json.dumps({"version": INIT_VERSION, "attention": attention, "config": config},
                        sort_keys=True, default=str).encode())
    h.update(json.dumps(prompts).encode())
    h.update(_file_sha256(minilm_path() / "model.safetensors").encode())
    return h.hexdigest()


@torch.no_grad()
def calibration_inputs(teacher, tokenizer, prompts: list[str], max_length: int = 64) -> list[torch.Tensor]:
    """Per layer, the inputs of its attention for every real token: list of (T, d) float64."""
    batch = tokenizer(prompts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    out = teacher(**batch, output_hidden_states=True)
    real = batch["attention_mask"].bool()
    return [h[real].double() for h in out.hidden_states[:-1]]


@torch.no_grad()
def calibration_context_rms(teacher, tokenizer, prompts: list[str], max_length: int = 64) -> list[torch.Tensor]:
    """Per layer, the RMS of MiniLM's attention context (softmax(QK^T)V, before the output
    projection) per head channel, over real tokens and heads: list of (d_h,) tensors."""
    batch = tokenizer(prompts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    real = batch["attention_mask"].bool()
    heads = teacher.config.num_attention_heads
    found, hooks = [], []
    for layer in teacher.encoder.layer:
        hooks.append(layer.attention.output.dense.register_forward_pre_hook(
            lambda mod, inp: found.append(inp[0][real].unflatten(-1, (heads, -1)))))
    try:
        teacher(**batch)
    finally:
        for h in hooks:
            h.remove()
    return [ctx.double().pow(2).mean(dim=(0, 1)).sqrt() for ctx in found]


def _bert_layer(sd: dict, i: int) -> dict:
    p = f"encoder.layer.{i}."
    names = {"q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
             "o": "attention.output.dense", "ln1": "attention.output.LayerNorm",
             "ffn_in": "intermediate.dense", "ffn_out": "output.dense", "ln2": "output.LayerNorm"}
    return {k: (sd[p + v + ".weight"], sd[p + v + ".bias"]) for k, v in names.items()}


def minilm_frozen_tensors(sd: dict, num_layers: int) -> dict[str, torch.Tensor]:
    """The ``MediagenTextEncoder`` parameters that are MiniLM's tensors as they are (embeddings and the
    first ``num_layers`` FFNs), by parameter name, from MiniLM's state dict ``sd``."""
    out = {"word_embeddings.weight": sd["embeddings.word_embeddings.weight"],
           "type_embedding": sd["embeddings.token_type_embeddings.weight"][0],
           "position_embeddings.weight": sd["embeddings.position_embeddings.weight"]}
    for i in range(num_layers):
        w = _bert_layer(sd, i)
        for name in ("ffn_in", "ffn_out"):
            out[f"layers.{i}.{name}.weight"], out[f"layers.{i}.{name}.bias"] = w[name]
    return out


def _copy_linear(lin, wb):
    lin.weight.copy_(wb[0])
    if lin.bias is not None:
        lin.bias.copy_(wb[1])


@torch.no_grad()
def map_mlra(attn: MLRAttention, w: dict, x: torch.Tensor) -> None:
    """Factor one BERT attention (w: q, k, v, o as (weight, bias)) into ``attn`` on inputs x (T, d)."""
    h, dh, dr, dl = attn.heads, attn.head_dim, attn.rope_dim, attn.latent_dim
    wq, bq = w["q"][0].double(), w["q"][1].double()
    wk, wv, bv = w["k"][0].double(), w["v"][0].double(), w["v"][1].double()
    wo, bo = w["o"][0].double(), w["o"][1].double()
    if attn.q_latent != wq.shape[0]:
        raise ValueError(f"MiniLM init needs q_latent == hidden ({wq.shape[0]}); got {attn.q_latent}")
    # queries: c_q = W_q x, then RMSNorm * q_scale; undo the typical RMS in the up-projection
    rms_q = (x @ wq.T).pow(2).mean(-1).sqrt().mean()
    widen = math.sqrt((dh + dr) / dh)
    q_up = torch.zeros(h, dh + dr, attn.q_latent, dtype=torch.float64)
    q_bias = torch.zeros(h, dh + dr, dtype=torch.float64)
    eye = torch.eye(attn.q_latent, dtype=torch.float64)
    for i in range(h):
        q_up[i, :dh] = eye[i * dh:(i + 1) * dh] * (rms_q / attn.q_scale) * widen
        q_bias[i, :dh] = bq[i * dh:(i + 1) * dh] * widen
    attn.q_down.weight.copy_(wq)
    attn.q_up.weight.copy_(q_up.flatten(0, 1))
    if attn.q_up.bias is not None:
        attn.q_up.bias.copy_(q_bias.flatten())
    # keys/values: latents from a data-aware SVD per head group
    groups = ([(list(range(h)), [0, 1, 2, 3])] if attn.branches == 4 else
              [(list(range(h // 2)), [0, 2]), (list(range(h // 2, h)), [1, 3])])
    down = torch.zeros(attn.kv_latent + dr, wq.shape[1], dtype=torch.float64)
    kv_up = torch.zeros(4, dl, attn.heads_per_latent, 2, dh, dtype=torch.float64)
    v_gain = 1.0 / attn.branch_scale
    cov = x.T @ x
    for heads, latents in groups:
        rows = torch.cat([torch.arange(i * dh, (i + 1) * dh) for i in heads])
        stacked = torch.cat([wk[rows], wv[rows]])                     # (2 * |heads| * dh, d)
        # left singular vectors of stacked @ x.T = eigenvectors of stacked (x^T x) stacked^T
        evals, evecs = torch.linalg.eigh(stacked @ cov @ stacked.T)
        u = evecs.flip(-1)[:, : dl * len(latents)]                    # top directions of the data
        for j, lat in enumerate(latents):
            u_l = u[:, j * dl:(j + 1) * dl]                           # (2 * |heads| * dh, dl)
            d_l = u_l.T @ stacked                                     # down-projection (dl, d)
            down[lat * dl:(lat + 1) * dl] = d_l
            rms = (x @ d_l.T).pow(2).mean(-1).sqrt().mean()
            gain = rms / attn.kv_scale
            u_k, u_v = u_l[: len(heads) * dh], u_l[len(heads) * dh:]
            for local, _ in enumerate(heads):
                kv_up[lat, :, local, 0] = u_k[local * dh:(local + 1) * dh].T * gain
                kv_up[lat, :, local, 1] = u_v[local * dh:(local + 1) * dh].T * gain * v_gain
    attn.kv_down.weight.copy_(down)
    attn.kv_up.copy_(kv_up.flatten(2))
    for norm in attn.kv_norms:
        norm.weight.fill_(1.0)
    attn.out_proj.weight.copy_(wo)
    if attn.out_proj.bias is not None:
        attn.out_proj.bias.copy_(bo + wo @ bv)


def _read_cached(path: Path, model: MediagenTextEncoder, frozen: dict) -> bool:
    """Load a cache entry over ``frozen`` (MiniLM's own tensors); False when absent or unusable."""
    if not path.is_file():
        return False
    try:
        stored = load_file(path)
        model.load_state_dict({**frozen, **stored}, strict=True)
    except (SafetensorError, OSError, RuntimeError, ValueError, KeyError) as err:  # torn or stale: calibrate again
        log.warning("ignoring the text encoder init cache %s (%s); calibrating again", path, err)
        return False
    log.debug("text encoder init read from the cache %s", path)
    return True


def _write_cached(path: Path, model: MediagenTextEncoder, frozen: dict, key: str) -> None:
    stored = {n: t.detach().cpu().contiguous() for n, t in model.state_dict().items() if n not in frozen}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        save_file(stored, tmp, metadata={"key": key, "version": INIT_VERSION})
        os.replace(tmp, path)                                          # readers never see half a file
    except OSError as err:                                             # a read-only cache only costs time
        log.warning("could not write the text encoder init cache %s: %s", path, err)


@torch.no_grad()
def encoder_from_minilm(attention: str, calibration_prompts: int = 256, cache_dir: str | Path | None = None,
                        **config) -> MediagenTextEncoder:
    """A ``MediagenTextEncoder`` of MiniLM's shape with ``attention`` initialised from MiniLM.
    ``num_layers`` (in ``config``) may keep only MiniLM's first layers (small tests). With ``cache_dir``
    the calibrated weights are read from / written to that folder (see the module docstring)."""
    teacher = load_minilm()
    tc = teacher.config
    num_layers = config.pop("num_layers", tc.num_hidden_layers)
    if not 1 <= num_layers <= tc.num_hidden_layers:
        raise ValueError(f"num_layers={num_layers} is not allowed: MiniLM has {tc.num_hidden_layers} layers "
                         f"(use 1 to {tc.num_hidden_layers})")
    model = MediagenTextEncoder(attention=attention, vocab_size=tc.vocab_size, hidden_size=tc.hidden_size,
                                num_layers=num_layers, num_heads=tc.num_attention_heads,
                                intermediate_size=tc.intermediate_size,
                                max_position_embeddings=tc.max_position_embeddings,
                                layer_norm_eps=tc.layer_norm_eps, pad_token_id=tc.pad_token_id, **config)
    sd = teacher.state_dict()
    frozen = minilm_frozen_tensors(sd, num_layers)
    prompts = make_prompts(calibration_prompts, "train", seed=1)
    cached = None
    if cache_dir is not None and attention in CALIBRATED:
        key = init_cache_key(attention, dict(model.config), prompts)
        cached = Path(cache_dir) / f"{attention}-{key}.safetensors"
        if _read_cached(cached, model, frozen):
            return model.eval()
    for name, tensor in frozen.items():
        model.get_parameter(name).copy_(tensor)
    model.embed_norm.weight.copy_(sd["embeddings.LayerNorm.weight"])
    model.embed_norm.bias.copy_(sd["embeddings.LayerNorm.bias"])
    tokenizer = load_minilm_tokenizer()
    inputs = contexts = None
    if attention in ("mlra2", "mlra4"):
        inputs = calibration_inputs(teacher, tokenizer, prompts)
    if attention == "hla":
        contexts = calibration_context_rms(teacher, tokenizer, prompts)
    for i, layer in enumerate(model.layers):
        w = _bert_layer(sd, i)
        attn = layer.attn
        if isinstance(attn, (MultiHeadSelfAttention, HLAttention)):
            for name in ("q", "k", "v"):
                _copy_linear(getattr(attn, f"{name}_proj"), w[name])
            _copy_linear(attn.out_proj, w["o"])
            if contexts is not None:                                   # HLA: match MiniLM's context scale
                attn.out_norm.weight.copy_(contexts[i])
        else:
            map_mlra(attn, w, inputs[i])
        for mod, name in ((layer.attn_norm, "ln1"), (layer.ffn_norm, "ln2")):
            _copy_linear(mod, w[name])
    if cached is not None:
        _write_cached(cached, model, frozen, key)
    return model.eval()

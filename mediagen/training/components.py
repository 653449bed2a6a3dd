"""Build what a run trains and what it is conditioned on, from the ``model`` and ``finetune`` sections.

- transformer: a preset (random init, seeded) or a saved folder (ours, or a diffusers pipeline
  folder with ``transformer/``); converted to MHLA / hybrid when ``model.attention`` is set;
- finetune modes: ``none``/``full`` train everything (or ``train_only``); ``lora`` adds peft LoRA
  adapters to the attention projections and trains only them; ``convert`` loads a softmax model,
  converts it and, with ``distill_weight`` > 0, keeps a frozen copy as the distillation teacher;
- text encoder (text tasks, frozen): ``byte`` (a seeded ``ByteTextEncoder`` or the one in the
  pretrained pipeline), ``pipeline`` (the pretrained pipeline's text_encoder + tokenizer), or a
  name for ``mediagen.text.encoders.load_text_encoder``;
- autoencoder (frozen): pixel space (``IdentityAutoencoder``) unless ``model.vae`` names a folder
  (``pipeline`` = the pretrained pipeline's ``vae/``).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from ..models.byte_text_encoder import ByteTextEncoder
from ..models.convert import convert
from ..models.identity_autoencoder import IdentityAutoencoder
from ..models.loading import load_transformer
from ..models.presets import build_transformer, preset
from .lora import add_lora


@dataclass
class Components:
    transformer: torch.nn.Module
    task: str
    vae: torch.nn.Module
    text_encoder: torch.nn.Module | None = None
    tokenizer: object | None = None
    teacher: torch.nn.Module | None = None
    is_lora: bool = False


def _pipeline_folder(path: Path) -> bool:
    return (path / "model_index.json").is_file()


def load_pretrained_transformer(path: str):
    folder = Path(path)
    if not folder.is_dir():
        raise ValueError(f"model.pretrained={path!r} is not a folder")
    return load_transformer(folder, "transformer" if _pipeline_folder(folder) else None)


def _check_task(transformer, task: str) -> None:
    is_text = hasattr(transformer.config, "text_dim")
    if (task == "class-to-image") == is_text:
        kind = "a text-conditioned (Wan-style)" if is_text else "a class-conditional (DiT)"
        raise ValueError(f"task={task!r} does not fit {kind} transformer {type(transformer).__name__}")


def _load_text_encoder(cfg, text_dim: int, seed: int):
    name = cfg.model.text_encoder
    pretrained = Path(cfg.model.pretrained) if cfg.model.pretrained else None
    has_pipeline_encoder = pretrained is not None and (pretrained / "text_encoder" / "config.json").is_file()
    if name == "byte" or name == "pipeline":
        if has_pipeline_encoder:
            folder = pretrained / "text_encoder"
            meta = json.loads((folder / "config.json").read_text())
            if meta.get("_class_name") == ByteTextEncoder.__name__:
                return ByteTextEncoder.from_pretrained(str(folder)), None
            if name == "pipeline":
                import transformers
                from transformers import AutoConfig, AutoTokenizer
                conf = AutoConfig.from_pretrained(str(folder))
                cls = (transformers.UMT5EncoderModel if conf.model_type == "umt5"
                       else transformers.T5EncoderModel if conf.model_type == "t5" else transformers.AutoModel)
                return cls.from_pretrained(str(folder)), AutoTokenizer.from_pretrained(str(pretrained / "tokenizer"))
        if name == "pipeline":
            raise ValueError(f"model.text_encoder='pipeline' needs model.pretrained to be a pipeline folder with "
                             f"text_encoder/; {cfg.model.pretrained!r} has none")
        torch.manual_seed(seed + 1)
        length = max(64, cfg.model.text_max_length)
        return ByteTextEncoder(hidden_size=text_dim, num_heads=4 if text_dim % 4 == 0 else 1, max_length=length), None
    from ..text.encoders import load_text_encoder
    pe = load_text_encoder(name)
    return pe.model, pe.tokenizer


def _load_vae(cfg, in_channels: int):
    name = cfg.model.vae
    if name is None:
        return IdentityAutoencoder(latent_channels=in_channels)
    folder = Path(cfg.model.pretrained) / "vae" if name == "pipeline" else Path(name)
    config = folder / "config.json"
    if not config.is_file():
        raise ValueError(f"model.vae={name!r}: no autoencoder config.json in {folder}")
    import diffusers
    cls_name = json.loads(config.read_text()).get("_class_name")
    if cls_name not in ("AutoencoderKL", "AutoencoderKLWan", "IdentityAutoencoder"):
        raise ValueError(f"{config} names _class_name={cls_name!r}; supported: AutoencoderKL, AutoencoderKLWan")
    cls = IdentityAutoencoder if cls_name == "IdentityAutoencoder" else getattr(diffusers, cls_name)
    return cls.from_pretrained(str(folder))


def _train_only(transformer, patterns) -> None:
    matched = 0
    for name, p in transformer.named_parameters():
        keep = any(s in name for s in patterns)
        p.requires_grad_(keep and p.requires_grad)
        matched += keep
    if not matched:
        raise ValueError(f"finetune.train_only={list(patterns)} matched no parameter name")


def _plain(section) -> dict:
    """A config section as plain Python values: list values from a dotlist (``patch_size=[1,4,4]``)
    are omegaconf ListConfigs, which the model's config.json cannot serialise."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(section, resolve=True) if OmegaConf.is_config(section) else dict(section)


def build_components(cfg) -> Components:
    m, ft = cfg.model, cfg.finetune
    if m.pretrained is not None:
        transformer = load_pretrained_transformer(m.pretrained)
    else:
        preset(m.preset)  # a clear error for an unknown name
        torch.manual_seed(cfg.train.seed)
        transformer = build_transformer(m.preset, **_plain(m.overrides))
    _check_task(transformer, cfg.task)
    teacher = None
    if ft.mode == "convert" and ft.distill_weight > 0:
        teacher = load_pretrained_transformer(ft.teacher) if ft.teacher else copy.deepcopy(transformer)
        teacher.requires_grad_(False).eval()
    if m.attention is not None:
        attention = m.attention if isinstance(m.attention, str) else list(m.attention)
        convert(transformer, attention, blocks=m.blocks, layers=m.layers, grid=m.grid, **_plain(m.attention_options))
    if ft.mode == "lora":
        add_lora(transformer, ft.lora_rank, ft.lora_alpha, ft.lora_targets)
    if ft.train_only:
        _train_only(transformer, ft.train_only)
    if m.gradient_checkpointing:
        transformer.enable_gradient_checkpointing()
    text_encoder = tokenizer = None
    if cfg.task != "class-to-image":
        text_encoder, tokenizer = _load_text_encoder(cfg, transformer.config.text_dim, cfg.train.seed)
        text_encoder.requires_grad_(False).eval()
        width = getattr(text_encoder.config, "hidden_size", None) or getattr(text_encoder.config, "d_model", None)
        if width is not None and width != transformer.config.text_dim:
            raise ValueError(f"model.text_encoder={m.text_encoder!r} gives {width}-wide states but the transformer's "
                             f"text_dim is {transformer.config.text_dim}")
    vae = _load_vae(cfg, transformer.config.in_channels).requires_grad_(False).eval()
    return Components(transformer, cfg.task, vae, text_encoder, tokenizer, teacher, ft.mode == "lora")

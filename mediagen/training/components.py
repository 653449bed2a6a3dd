"""Build what a run trains and what it is conditioned on, from the ``model`` and ``finetune`` sections.

- transformer: a preset (random init, seeded), a saved folder (ours, or a diffusers pipeline folder
  with ``transformer/``) or a shipped checkpoint by name (``image-mhla``, ``video-mhla``, ..., as
  ``mediagen generate`` takes them); converted to MHLA / hybrid when ``model.attention`` is set;
- finetune modes: ``none``/``full`` train everything (or ``train_only``); ``lora`` adds peft LoRA
  adapters to the attention projections and trains only them; ``convert`` loads a softmax model,
  converts it and, with ``distill_weight`` > 0, keeps a frozen copy as the distillation teacher;
- text encoder (text tasks, frozen): unset, the one the pretrained model was trained with (its
  pipeline's ``text_encoder/`` + ``tokenizer/``, or the encoder a shipped folder's
  ``text_encoder_ref.json`` names), and a seeded ``ByteTextEncoder`` for a preset or a bare
  transformer folder; another encoder only when named: ``byte`` (the pipeline's when it is one, else a
  new seeded one), ``pipeline`` (the pipeline's own; an error without one), or a name for
  ``mediagen.text.encoders.load_text_encoder``. A model conditioned on other states than its encoder's
  reads them as noise: fine-tuning the shipped video-mhla (configs/train/wan-mmnist-mhla.yaml, batch 8)
  starts at loss 0.117 on a new byte encoder against 0.016 on its MiniLM;
- text refiner (``model.text_refiner_layers`` > 0, Wan models): a model without one gets a fresh
  ``TextRefiner`` (``models.text_refiner``: the identity at first, so training starts from the model's own
  outputs) that trains with the rest (``full`` / ``none`` / ``convert``); a model with one keeps it, and its
  block count must match. ``lora`` refuses to add one: the new module would have to train in full beside the
  adapters, which the LoRA export (adapters only) does not save; add it with ``finetune.mode=full``;
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
from ..models.norms import cast_rms_norms
from ..models.presets import build_transformer, preset
from ..models.text_refiner import add_text_refiner, text_refiner_of
from ..pipelines.shipping import TEXT_ENCODER_REF, checkpoints_dir, shipped_checkpoint
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
    text_encoder_name: str = "byte"   # what conditions the run: "byte", "pipeline" or an encoder name (cache key)


def _pipeline_folder(path: Path) -> bool:
    return (path / "model_index.json").is_file()


def shipped_pipelines() -> list[str]:
    """Names of the shipped pipeline checkpoints (image-mhla, ..., video-mhla), for messages."""
    root = checkpoints_dir()
    return sorted(p.name for p in root.iterdir() if (p / "model_index.json").is_file()) if root.is_dir() else []


def pretrained_folder(value: str, key: str = "model.pretrained") -> Path:
    """The folder ``value`` names: a folder, else a shipped checkpoint's name (as ``mediagen generate`` and
    ``mediagen fid`` take them, e.g. "image-mhla"); a folder of that name wins over the shipped one."""
    folder = Path(value)
    if folder.is_dir():
        return folder
    shipped = shipped_checkpoint(str(value))
    if shipped is not None:
        return shipped
    raise ValueError(f"{key}={value!r} is neither a folder nor a shipped checkpoint: give a saved pipeline or "
                     f"transformer folder, or one of {shipped_pipelines()}")


def load_pretrained_transformer(path: str, key: str = "model.pretrained"):
    folder = pretrained_folder(path, key)
    return load_transformer(folder, "transformer" if _pipeline_folder(folder) else None)


# the text-conditioned models to fine-tune on captions; class-conditional ones take class labels only
CAPTION_HINT = ("to fine-tune a shipped model on captioned images use task=text-to-image with "
                "model.pretrained=video-mhla (or video-sdpa), which train on an image as a one-frame clip")


def _check_task(transformer, task: str, pretrained: str | None = None) -> None:
    is_text = hasattr(transformer.config, "text_dim")
    if (task == "class-to-image") == is_text:
        kind = "a text-conditioned (Wan-style)" if is_text else "a class-conditional (DiT)"
        source = f" (model.pretrained={pretrained!r})" if pretrained else ""
        hint = (f": it takes class labels (task=class-to-image, data.dataset=mnist); {CAPTION_HINT}" if not is_text
                else ": it takes captions (task=text-to-image or text-to-video)")
        raise ValueError(f"task={task!r} does not fit {kind} transformer {type(transformer).__name__}{source}{hint}")


def _byte_encoder(cfg, text_dim: int, seed: int) -> ByteTextEncoder:
    torch.manual_seed(seed + 1)
    length = max(64, cfg.model.text_max_length)
    return ByteTextEncoder(hidden_size=text_dim, num_heads=4 if text_dim % 4 == 0 else 1, max_length=length)


def _folder_encoder(pretrained: Path):
    """(model, tokenizer) of a pipeline folder's text_encoder/ (+ tokenizer/)."""
    folder = pretrained / "text_encoder"
    meta = json.loads((folder / "config.json").read_text())
    if meta.get("_class_name") == ByteTextEncoder.__name__:
        return ByteTextEncoder.from_pretrained(str(folder)), None
    if meta.get("_class_name") == "MediagenTextEncoder":
        from ..text.encoders import load_text_encoder
        pe = load_text_encoder(str(folder))
        return pe.model, pe.tokenizer
    import transformers
    from transformers import AutoConfig, AutoTokenizer
    conf = AutoConfig.from_pretrained(str(folder))
    cls = (transformers.UMT5EncoderModel if conf.model_type == "umt5"
           else transformers.T5EncoderModel if conf.model_type == "t5" else transformers.AutoModel)
    return cls.from_pretrained(str(folder)), AutoTokenizer.from_pretrained(str(pretrained / "tokenizer"))


def _own_encoder(pretrained: Path | None) -> tuple[str, str] | None:
    """How a pretrained pipeline carries the encoder it was trained with: ("folder", "pipeline") for its
    text_encoder/, ("ref", name) for a shipped folder's text_encoder_ref.json; None without one."""
    if pretrained is None:
        return None
    if (pretrained / "text_encoder" / "config.json").is_file():
        return "folder", "pipeline"
    ref = pretrained / TEXT_ENCODER_REF
    if ref.is_file():
        name = json.loads(ref.read_text()).get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{ref} must hold {{\"name\": <text encoder name>}}; got {ref.read_text()!r}")
        return "ref", name
    return None


def _load_text_encoder(cfg, text_dim: int, seed: int, pretrained: Path | None):
    """(model, tokenizer, name) of the frozen text encoder; the name keys the text cache."""
    from ..text.encoders import load_text_encoder

    name = cfg.model.text_encoder
    own = _own_encoder(pretrained)
    if name is None or name == "pipeline":
        # the encoder the model was trained on: the transformer learned to read its states, and another
        # encoder's (a new random byte encoder's above all) read as noise to it
        if own is None:
            if name == "pipeline":
                raise ValueError(f"model.text_encoder='pipeline' needs model.pretrained to be a pipeline folder "
                                 f"with text_encoder/ (or a shipped one); {cfg.model.pretrained!r} has none")
            return _byte_encoder(cfg, text_dim, seed), None, "byte"
        if own[0] == "folder":
            model, tokenizer = _folder_encoder(pretrained)
            return model, tokenizer, "byte" if isinstance(model, ByteTextEncoder) else "pipeline"
        pe = load_text_encoder(own[1])
        return pe.model, pe.tokenizer, own[1]
    if name == "byte":
        if own is not None and own[0] == "folder":
            model, tokenizer = _folder_encoder(pretrained)
            if isinstance(model, ByteTextEncoder):
                return model, tokenizer, "byte"
        if own is not None:
            print(f"model.text_encoder='byte': a new ByteTextEncoder (random, seeded), not the "
                  f"{own[1]} encoder {cfg.model.pretrained} was trained with (leave model.text_encoder unset "
                  f"to keep that one)")
        return _byte_encoder(cfg, text_dim, seed), None, "byte"
    pe = load_text_encoder(name)
    return pe.model, pe.tokenizer, name


def _load_vae(cfg, in_channels: int, pretrained: Path | None):
    name = cfg.model.vae
    if name is None:
        return IdentityAutoencoder(latent_channels=in_channels)
    if name == "pipeline" and pretrained is None:
        raise ValueError("model.vae='pipeline' needs model.pretrained (the pipeline folder whose vae/ to use)")
    folder = pretrained / "vae" if name == "pipeline" else Path(name)
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


def _check_overrides(spec: dict, overrides: dict) -> None:
    """model.overrides keys against the arguments of the preset's transformer class: a misspelt key would
    otherwise reach the constructor and fail as a TypeError traceback."""
    import inspect

    import diffusers

    from .config import ConfigError

    cls = getattr(diffusers, str(spec.get("class")), None)
    if cls is None or not overrides:
        return
    taken = [n for n in inspect.signature(cls.__init__).parameters if n not in ("self", "args", "kwargs")]
    for key, value in overrides.items():
        if key not in taken:
            raise ConfigError(f"model.overrides.{key}={value!r} is not allowed: {cls.__name__} takes none such; "
                              f"its config keys: {taken}", key=f"model.overrides.{key}")
        # counts the model is built from: zero or fewer would build a model without layers, heads or
        # channels, which fails deep in the first forward (an IndexError) instead of naming the key
        if (key.startswith("num_") or key.endswith(("_dim", "_channels", "_size"))) and \
                isinstance(value, int) and not isinstance(value, bool) and value < 1:
            raise ConfigError(f"model.overrides.{key}={value!r} is not allowed: use an int >= 1",
                              key=f"model.overrides.{key}")


def _text_refiner(transformer, layers: int, mode: str) -> None:
    """model.text_refiner_layers: add a fresh refiner of ``layers`` blocks where the model has none; a model
    that has one keeps it (its block count must be ``layers``, or 0: keep whatever it has)."""
    from .config import ConfigError

    key = "model.text_refiner_layers"
    refiner = text_refiner_of(transformer)
    if refiner is not None:
        if layers and layers != len(refiner.blocks):
            raise ConfigError(f"{key}={layers} is not allowed: the model already has a text refiner of "
                              f"{len(refiner.blocks)} blocks; use {key}={len(refiner.blocks)} (or 0: keep it)", key=key)
        return
    if not layers:
        return
    if not hasattr(transformer.config, "text_dim"):
        raise ConfigError(f"{key}={layers} is not allowed: a text refiner is for text-conditioned Wan models, "
                          f"not a {type(transformer).__name__}", key=key)
    if mode == "lora":
        raise ConfigError(f"{key}={layers} is not allowed with finetune.mode=lora: the new refiner trains in full "
                          f"and the LoRA export saves adapters only; add it with finetune.mode=full", key=key)
    add_text_refiner(transformer, layers=layers)


def build_components(cfg) -> Components:
    m, ft = cfg.model, cfg.finetune
    pretrained = None
    if m.pretrained is not None:
        pretrained = pretrained_folder(m.pretrained)
        transformer = load_pretrained_transformer(m.pretrained)
    else:
        overrides = _plain(m.overrides)
        _check_overrides(preset(m.preset), overrides)  # preset(): a clear error for an unknown name
        torch.manual_seed(cfg.train.seed)
        transformer = build_transformer(m.preset, **overrides)
    _check_task(transformer, cfg.task, m.pretrained)
    teacher = None
    if ft.distill_weight > 0:  # convert: the softmax model; full: the starting model (config.py allows these)
        teacher = (load_pretrained_transformer(ft.teacher, "finetune.teacher") if ft.teacher
                   else copy.deepcopy(transformer))
        teacher.requires_grad_(False).eval()
    if m.attention is not None:
        attention = m.attention if isinstance(m.attention, str) else list(m.attention)
        convert(transformer, attention, blocks=m.blocks, layers=m.layers, grid=m.grid, **_plain(m.attention_options))
    _text_refiner(transformer, m.text_refiner_layers, ft.mode)
    if ft.mode == "lora":
        add_lora(transformer, ft.lora_rank, ft.lora_alpha, ft.lora_targets)
    if ft.train_only:
        _train_only(transformer, ft.train_only)
    if m.gradient_checkpointing:
        transformer.enable_gradient_checkpointing()
    # bf16 activations with fp32 weights: keep torch's fused RMSNorm (models/norms.py), whatever the attention
    cast_rms_norms(transformer)
    if teacher is not None:
        cast_rms_norms(teacher)
    text_encoder = tokenizer = None
    encoder_name = "byte"
    if cfg.task != "class-to-image":
        text_encoder, tokenizer, encoder_name = _load_text_encoder(cfg, transformer.config.text_dim, cfg.train.seed,
                                                                   pretrained)
        text_encoder.requires_grad_(False).eval()
        width = getattr(text_encoder.config, "hidden_size", None) or getattr(text_encoder.config, "d_model", None)
        if width is not None and width != transformer.config.text_dim:
            raise ValueError(f"model.text_encoder={m.text_encoder!r} ({encoder_name}) gives {width}-wide states but "
                             f"the transformer's text_dim is {transformer.config.text_dim}")
    vae = _load_vae(cfg, transformer.config.in_channels, pretrained).requires_grad_(False).eval()
    return Components(transformer, cfg.task, vae, text_encoder, tokenizer, teacher, ft.mode == "lora", encoder_name)


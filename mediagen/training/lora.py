"""LoRA on the attention projections through peft, for any diffusers transformer (DiT has no
``add_adapter``): inject, train only the adapters, save them, and fuse them for export.

A LoRA layer computes W x + (alpha / r) B A x with A (r x in), B (out x r); fusing adds
(alpha / r) B A to W, after which the plain layer replaces the peft wrapper.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file


def add_lora(model: torch.nn.Module, rank: int, alpha: float, targets) -> None:
    from peft import LoraConfig, inject_adapter_in_model

    model.requires_grad_(False)
    config = LoraConfig(r=rank, lora_alpha=alpha, init_lora_weights="gaussian", target_modules=list(targets))
    try:
        inject_adapter_in_model(config, model)
    except ValueError as err:
        raise ValueError(f"finetune.lora_targets={list(targets)} matched no module of the transformer: {err}") from None
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name)


def lora_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    from peft import get_peft_model_state_dict

    return {k: v.detach().cpu().contiguous() for k, v in get_peft_model_state_dict(model).items()}


def save_lora(model: torch.nn.Module, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "lora.safetensors"
    save_file(lora_state_dict(model), str(path))
    return path


@torch.no_grad()
def fuse_lora_(model: torch.nn.Module) -> torch.nn.Module:
    """Merge every LoRA adapter into its base weight and drop the peft wrappers (in place)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    wrapped = [(name, m) for name, m in model.named_modules() if isinstance(m, BaseTunerLayer)]
    for name, module in wrapped:
        module.merge()
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, module.get_base_layer())
    return model

"""What every text encoder here returns."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from diffusers.utils import BaseOutput


@dataclass
class TextEncoderOutput(BaseOutput):
    """last_hidden_state (B, L, C), zero at padded positions; attention_mask (B, L), 1 = real token;
    aux_loss: HLA's gate regularisers summed over layers (a scalar; 0 for other attentions)."""

    last_hidden_state: torch.Tensor
    attention_mask: torch.Tensor
    aux_loss: torch.Tensor | None = None

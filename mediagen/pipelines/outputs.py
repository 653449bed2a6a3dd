"""Pipeline output dataclasses (diffusers ``BaseOutput``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from diffusers.pipelines.pipeline_utils import ImagePipelineOutput
from diffusers.utils import BaseOutput


@dataclass
class VideoPipelineOutput(BaseOutput):
    """frames: np (B, F, H, W, C) in [0, 1], torch (B, F, C, H, W), a list of lists of PIL images,
    or latents (B, C, F, H, W) for output_type="latent"."""

    frames: np.ndarray | torch.Tensor | list


__all__ = ["ImagePipelineOutput", "VideoPipelineOutput"]

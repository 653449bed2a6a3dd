"""An autoencoder that does nothing, with the interface of diffusers' VAEs, for pixel-space models.

``encode(x).latent_dist.sample()`` returns x and ``decode(z).sample`` returns z, so a pipeline can
treat a pixel-space transformer exactly like a latent one. Compression factors are 1; the config
names them as ``AutoencoderKLWan`` does (``scale_factor_spatial``/``scale_factor_temporal``).
"""

from __future__ import annotations

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.autoencoders.vae import DecoderOutput
from diffusers.models.modeling_outputs import AutoencoderKLOutput
from diffusers.models.modeling_utils import ModelMixin


class IdentityDistribution:
    """Stands in for ``DiagonalGaussianDistribution``: a point mass at the input."""

    def __init__(self, x: torch.Tensor):
        self.mean = x

    def sample(self, generator=None) -> torch.Tensor:
        return self.mean

    def mode(self) -> torch.Tensor:
        return self.mean


class IdentityAutoencoder(ModelMixin, ConfigMixin):
    """Pixel space as latent space: images/videos in [-1, 1] are their own latents."""

    @register_to_config
    def __init__(self, latent_channels: int = 3, scaling_factor: float = 1.0, scale_factor_spatial: int = 1,
                 scale_factor_temporal: int = 1):
        super().__init__()
        # one constant so the model has a device and dtype like any other component
        self.register_buffer("unit", torch.ones(1))

    def encode(self, x: torch.Tensor, return_dict: bool = True):
        dist = IdentityDistribution(x)
        return AutoencoderKLOutput(latent_dist=dist) if return_dict else (dist,)

    def decode(self, z: torch.Tensor, return_dict: bool = True, **kwargs):
        return DecoderOutput(sample=z) if return_dict else (z,)

    def forward(self, sample: torch.Tensor, return_dict: bool = True):
        return self.decode(self.encode(sample).latent_dist.mode(), return_dict=return_dict)

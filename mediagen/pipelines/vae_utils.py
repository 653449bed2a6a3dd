"""What a pipeline needs to know about its autoencoder: compression factors and latent scaling.

Works for ``IdentityAutoencoder`` (pixel space), diffusers' ``AutoencoderKL`` (images, latents
divided by ``scaling_factor``) and ``AutoencoderKLWan`` (video, per-channel latents_mean/std).
"""

from __future__ import annotations

import torch


def vae_factors(vae) -> tuple[int, int]:
    """(temporal, spatial) compression of the autoencoder."""
    cfg = vae.config
    spatial = getattr(cfg, "scale_factor_spatial", None)
    if spatial is None:
        spatial = 2 ** (len(cfg.block_out_channels) - 1) if hasattr(cfg, "block_out_channels") else 1
    return int(getattr(cfg, "scale_factor_temporal", 1) or 1), int(spatial)


def latents_to_vae(vae, latents: torch.Tensor) -> torch.Tensor:
    """Undo the latent normalisation the transformer works in, before ``vae.decode``."""
    cfg = vae.config
    if getattr(cfg, "latents_mean", None) is not None:  # AutoencoderKLWan
        shape = (1, -1) + (1,) * (latents.dim() - 2)
        mean = torch.tensor(cfg.latents_mean, device=latents.device, dtype=latents.dtype).view(shape)
        std = torch.tensor(cfg.latents_std, device=latents.device, dtype=latents.dtype).view(shape)
        return latents * std + mean
    shift = getattr(cfg, "shift_factor", None) or 0.0
    return latents / getattr(cfg, "scaling_factor", 1.0) + shift


def vae_dtype(vae) -> torch.dtype:
    return next(iter(vae.parameters()), next(iter(vae.buffers()), torch.empty(0))).dtype

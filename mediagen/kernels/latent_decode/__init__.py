"""Single-token attention over a shared latent cache (MLRA / MLA decode with absorbed weights)."""

from .op import DECODE_BACKENDS, latent_decode, latent_decode_reference

__all__ = ["DECODE_BACKENDS", "latent_decode", "latent_decode_reference"]

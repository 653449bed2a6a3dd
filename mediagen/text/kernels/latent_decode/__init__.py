"""Single-token attention over a shared latent cache (MLRA / MLA decode with absorbed weights), and
the elementwise work of a decode step around it."""

from .op import DECODE_BACKENDS, decode_prepare, decode_prepare_reference, latent_decode, latent_decode_reference

__all__ = ["DECODE_BACKENDS", "decode_prepare", "decode_prepare_reference", "latent_decode",
           "latent_decode_reference"]

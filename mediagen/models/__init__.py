"""Diffusion transformers (diffusers' own, converted to MHLA), small model presets, autoencoders.

Names are imported on first use (module ``__getattr__``) so ``import mediagen.models`` stays light.
"""

import importlib

_EXPORTS = {
    "convert": ".convert",
    "attention_spec_of": ".convert",
    "AttentionSpec": ".attention_spec",
    "auto_blocks": ".attention_spec",
    "MHLAWanTransformer3DModel": ".converted",
    "MHLADiTTransformer2DModel": ".converted",
    "MHLASanaTransformer2DModel": ".converted",
    "load_transformer": ".loading",
    "build_transformer": ".presets",
    "preset": ".presets",
    "PRESETS": ".presets",
    "IdentityAutoencoder": ".identity_autoencoder",
    "ByteTextEncoder": ".byte_text_encoder",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

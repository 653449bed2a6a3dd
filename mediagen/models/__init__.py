"""Diffusion transformers (diffusers' own, converted to MHLA), small model presets, autoencoders.

Names are imported on first use (module ``__getattr__``) so ``import mediagen.models`` stays light.
"""

import importlib
import sys
import types

_EXPORTS = {
    "convert": ".convert",
    "attention_spec_of": ".convert",
    "add_text_refiner": ".text_refiner",
    "TextRefiner": ".text_refiner",
    "AttentionSpec": ".attention_spec",
    "auto_blocks": ".attention_spec",
    "ATTENTION_CHOICES": ".attention_spec",
    "LAYER_ATTENTIONS": ".attention_spec",
    "OPTION_NAMES": ".attention_spec",
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


class _Package(types.ModuleType):
    """This package's module type: an exported name wins over a submodule of the same name.

    Importing a submodule sets it as an attribute of its package, so once ``mediagen.models.convert``
    (the module) is imported, ``from mediagen.models import convert`` would give the module instead of
    the function. Such a setattr is skipped, and the name is served by ``__getattr__`` from
    ``_EXPORTS``; the submodule itself stays importable by its full name."""

    def __setattr__(self, name, value):
        if name in _EXPORTS and isinstance(value, types.ModuleType) and value.__name__ == f"{__name__}.{name}":
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

"""mediagen: image and video diffusion transformers on MHLA (token-level multi-head linear attention)."""

import importlib

__version__ = "0.1.0"

# Public names, imported on first use so that ``import mediagen`` stays light (no torch/diffusers).
# Diffusers' pipeline loader also finds saved component classes through these names.
_EXPORTS = {
    "convert": "mediagen.models.convert",
    "MHLAWanTransformer3DModel": "mediagen.models.converted",
    "MHLADiTTransformer2DModel": "mediagen.models.converted",
    "MHLASanaTransformer2DModel": "mediagen.models.converted",
    "IdentityAutoencoder": "mediagen.models.identity_autoencoder",
    "ByteTextEncoder": "mediagen.models.byte_text_encoder",
    "MediagenTextEncoder": "mediagen.text.encoders.encoder",
    "ClassConditionalImagePipeline": "mediagen.pipelines.class_image",
    "TextToVideoPipeline": "mediagen.pipelines.text_video",
    "TextToImagePipeline": "mediagen.pipelines.text_image",
}


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'mediagen' has no attribute {name!r}")

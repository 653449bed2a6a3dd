"""Imports the component classes our saved pipelines name in model_index.json.

Diffusers' loader resolves a component recorded as ["mediagen.models.converted",
"MHLAWanTransformer3DModel"] from ``sys.modules`` only (it does not import modules a folder
names), so every pipeline module imports this one.
"""

from ..models import byte_text_encoder, converted, identity_autoencoder  # noqa: F401

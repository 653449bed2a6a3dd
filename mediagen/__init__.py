"""mediagen: image and video diffusion transformers on MHLA (token-level multi-head linear attention)."""

__version__ = "0.1.0"

"""The elementwise work of MLRA's short path around its GEMMs: the query and latent norms with the rope
key's rotation (``short_prepare``), and the rope query's rotation (``rope_columns``)."""

from .op import SHORT_BACKENDS, rope_columns, rope_columns_reference, short_prepare, short_prepare_reference

__all__ = ["SHORT_BACKENDS", "rope_columns", "rope_columns_reference", "short_prepare", "short_prepare_reference"]

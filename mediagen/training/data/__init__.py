"""Training datasets. Every item is a dict: ``pixels`` float tensor in [-1, 1], (C, H, W) for images
or (C, F, H, W) for videos, plus ``label`` (int) or ``caption`` (str); encoded clips (``latent_cache.py``)
have ``latents`` in place of ``pixels``. Items are deterministic
functions of their index, so a resumed run sees exactly the batches it would have seen.

``build_dataset(cfg.data, task)`` picks one by ``data.dataset``; ``bucket_ids()`` on a dataset
groups items that can share a batch (same frame count and resolution).
"""

from .build import build_dataset, collate

__all__ = ["build_dataset", "collate"]

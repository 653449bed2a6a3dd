"""Load a saved transformer folder as the class its config names (converted ones come back converted)."""

from __future__ import annotations

import json
from pathlib import Path


def transformer_classes() -> dict:
    from diffusers import DiTTransformer2DModel, SanaTransformer2DModel, WanTransformer3DModel

    from .converted import MHLADiTTransformer2DModel, MHLASanaTransformer2DModel, MHLAWanTransformer3DModel

    classes = (WanTransformer3DModel, DiTTransformer2DModel, SanaTransformer2DModel, MHLAWanTransformer3DModel,
               MHLADiTTransformer2DModel, MHLASanaTransformer2DModel)
    return {c.__name__: c for c in classes}


def load_transformer(path: str | Path, subfolder: str | None = None, **kwargs):
    """``from_pretrained`` with the class read from ``config.json``'s ``_class_name``."""
    folder = Path(path) / (subfolder or "")
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ValueError(f"path={str(path)!r}: no config.json in {folder}; expected a saved transformer folder")
    name = json.loads(config_file.read_text()).get("_class_name")
    classes = transformer_classes()
    if name not in classes:
        raise ValueError(f"{config_file} names _class_name={name!r}; loadable: {sorted(classes)}")
    return classes[name].from_pretrained(str(folder), **kwargs)

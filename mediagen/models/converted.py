"""Converted model classes: a diffusers transformer plus one config field, ``mediagen_attention``.

``mediagen.convert`` switches a model's class to the matching class here (in place, keeping every
weight) and records the ``AttentionSpec`` in its config. ``save_pretrained`` then writes
``_class_name: MHLAWanTransformer3DModel`` and the spec; ``from_pretrained`` runs ``__init__``
with the spec, which rebuilds the processors before the weights (Mc included) are loaded.

The classes are made by ``converted_class`` from the base class's own ``__init__`` signature plus
the new field, so they follow diffusers' config handling without restating every argument.
They live at module level so diffusers' pipeline loader finds them by module and class name.
"""

from __future__ import annotations

import inspect

from diffusers import DiTTransformer2DModel, SanaTransformer2DModel, WanTransformer3DModel
from diffusers.configuration_utils import register_to_config
from diffusers.models.modeling_utils import ModelMixin  # noqa: F401  diffusers' pipeline loader looks it up here

from .attention_setup import apply_attention
from .attention_spec import AttentionSpec

CONFIG_KEY = "mediagen_attention"


def converted_class(base: type, name: str) -> type:
    base_init = base.__init__

    def __init__(self, mediagen_attention: dict | None = None, **kwargs):
        base_init(self, **kwargs)
        if mediagen_attention is not None:
            apply_attention(self, AttentionSpec.from_dict(dict(mediagen_attention)))

    # The signature diffusers reads to build/extract the config: the base's arguments + ours.
    params = list(inspect.signature(base_init).parameters.values())
    extra = inspect.Parameter(CONFIG_KEY, inspect.Parameter.KEYWORD_ONLY, default=None)
    params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) if i else p for i, p in enumerate(params)]
    __init__.__signature__ = inspect.Signature(params + [extra])
    namespace = {
        "__init__": register_to_config(__init__),
        "__module__": __name__,
        "__doc__": f"{base.__name__} whose self-attention layers follow ``config.{CONFIG_KEY}``.",
    }
    return type(name, (base,), namespace)


MHLAWanTransformer3DModel = converted_class(WanTransformer3DModel, "MHLAWanTransformer3DModel")
MHLADiTTransformer2DModel = converted_class(DiTTransformer2DModel, "MHLADiTTransformer2DModel")
MHLASanaTransformer2DModel = converted_class(SanaTransformer2DModel, "MHLASanaTransformer2DModel")

CONVERTED = {WanTransformer3DModel: MHLAWanTransformer3DModel, DiTTransformer2DModel: MHLADiTTransformer2DModel,
             SanaTransformer2DModel: MHLASanaTransformer2DModel}


def converted_class_for(model) -> type:
    cls = type(model)
    if cls in CONVERTED.values():
        return cls
    if cls not in CONVERTED:
        names = ", ".join(c.__name__ for c in CONVERTED)
        raise ValueError(f"model of type {cls.__name__} cannot be converted: use one of {names}")
    return CONVERTED[cls]

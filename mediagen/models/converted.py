"""Converted model classes: a diffusers transformer plus the config fields ``mediagen_attention`` and, for
Wan, ``mediagen_text_refiner`` (``models.text_refiner``: a self-attention over the text states; None: none;
a model without one saves no such key, and DiT / SANA refuse one).

``mediagen.convert`` switches a model's class to the matching class here (in place, keeping every
weight) and records the ``AttentionSpec`` in its config. ``save_pretrained`` then writes
``_class_name: MHLAWanTransformer3DModel`` and the spec, its layers as the model runs them
(``attention_setup.layers_in_use``: a layer given back softmax with diffusers' ``set_attn_processor``
saves as softmax); ``from_pretrained`` runs ``__init__`` with the spec, which rebuilds the processors
before the weights (Mc included) are loaded.

The classes are made by ``converted_class`` from the base class's own ``__init__`` signature plus
the new field, so they follow diffusers' config handling without restating every argument.
They live at module level so diffusers' pipeline loader finds them by module and class name.

A saved converted model must not load silently as the plain diffusers class: diffusers 0.42 ignores
an unknown ``_class_name`` and only logs unexpected config keys and weights, which would give the
original attention back with the MHLA weights dropped. The one config entry plain diffusers checks
before building a model is ``quantization_config``: its ``quant_method`` must name a known quantizer,
else ``from_pretrained`` raises ValueError quoting it. So the saved config carries a
``quantization_config`` whose ``quant_method`` says how to load the folder (``LOAD_MARKER``); the
converted classes drop it again when they load, and a model in memory never has it.
"""

from __future__ import annotations

import functools
import inspect
import json

from diffusers import DiTTransformer2DModel, SanaTransformer2DModel, WanTransformer3DModel
from diffusers.configuration_utils import register_to_config
from diffusers.models.modeling_utils import ModelMixin  # noqa: F401  diffusers' pipeline loader looks it up here

from .attention_setup import apply_attention, layers_in_use
from .attention_spec import AttentionSpec
from .text_refiner import CONFIG_KEY as REFINER_KEY  # a Wan model's text refiner, or None

CONFIG_KEY = "mediagen_attention"
MARKER_KEY = "quantization_config"
MARKER_PREFIX = "mediagen-converted-model"


def load_marker(class_name: str, refiner: bool = False) -> dict:
    """The ``quantization_config`` written into a saved converted model's config.json (not a
    quantization: plain diffusers' error message quotes ``quant_method``, so it says what to do)."""
    return {"quant_method": f"{MARKER_PREFIX} (this folder holds a mediagen {class_name} with MHLA / linear "
                            f"attention layers{' or a text refiner' if refiner else ''} that plain diffusers would "
                            f"drop: load it with "
                            f"mediagen.models.load_transformer(path) or mediagen.{class_name}.from_pretrained(path))"}


def is_load_marker(value) -> bool:
    return isinstance(value, dict) and str(value.get("quant_method", "")).startswith(MARKER_PREFIX)


def converted_class(base: type, name: str) -> type:
    base_init = base.__init__

    def __init__(self, mediagen_attention: dict | None = None, mediagen_text_refiner: dict | None = None, **kwargs):
        if mediagen_text_refiner is not None and base is not WanTransformer3DModel:
            raise ValueError(f"{REFINER_KEY}={mediagen_text_refiner!r} is not allowed for a {name}: only Wan "
                             f"models (MHLAWanTransformer3DModel) take a text refiner")
        base_init(self, **kwargs)
        if mediagen_attention is not None:
            apply_attention(self, AttentionSpec.from_dict(dict(mediagen_attention)))
        if mediagen_text_refiner is not None:
            from .text_refiner import attach_text_refiner, refiner_options

            attach_text_refiner(self, refiner_options(self.config.text_dim, **dict(mediagen_text_refiner)))

    # The signature diffusers reads to build/extract the config: the base's arguments + ours.
    params = list(inspect.signature(base_init).parameters.values())
    extra = [inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, default=None)
             for key in (CONFIG_KEY, REFINER_KEY)]
    params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) if i else p for i, p in enumerate(params)]
    __init__.__signature__ = inspect.Signature(params + extra)
    def to_json_string(self) -> str:
        config = json.loads(base.to_json_string(self))
        if config.get(CONFIG_KEY) is not None:
            # the saved layers describe the processors the model runs (a layer given back softmax with
            # set_attn_processor loads as softmax), so the saved folder loads as the model ran
            config[CONFIG_KEY]["layers"] = layers_in_use(self, config[CONFIG_KEY]["layers"])
        if config.get(REFINER_KEY) is None:
            config.pop(REFINER_KEY, None)  # a model without a refiner saves the config it saved before
        if (config.get(CONFIG_KEY) is not None or config.get(REFINER_KEY) is not None) and MARKER_KEY not in config:
            config[MARKER_KEY] = load_marker(name, refiner=config.get(REFINER_KEY) is not None)
        return json.dumps(config, indent=2, sort_keys=True) + "\n"

    @functools.wraps(base.save_pretrained)
    def save_pretrained(self, *args, **kwargs):
        if self.config.get(CONFIG_KEY) is not None:
            # refused before diffusers writes anything: it opens config.json before asking for its text
            layers_in_use(self, self.config[CONFIG_KEY]["layers"])
        return base.save_pretrained(self, *args, **kwargs)

    def load_config(cls, *args, **kwargs):
        out = base.load_config.__func__(cls, *args, **kwargs)
        config = out[0] if isinstance(out, tuple) else out
        _check_family(config.get("_class_name"), base, name, args[0] if args else
                      kwargs.get("pretrained_model_name_or_path"), kwargs.get("subfolder"))
        if is_load_marker(config.get(MARKER_KEY)):
            del config[MARKER_KEY]
        return out

    namespace = {
        "__init__": register_to_config(__init__),
        "to_json_string": to_json_string,
        "save_pretrained": save_pretrained,
        "load_config": classmethod(load_config),
        "__module__": __name__,
        "__doc__": f"{base.__name__} whose self-attention layers follow ``config.{CONFIG_KEY}``"
                   + (f" and whose text states pass a ``TextRefiner`` when ``config.{REFINER_KEY}`` is set."
                      if base is WanTransformer3DModel else "."),
    }
    return type(name, (base,), namespace)


def _check_family(saved: str | None, base: type, name: str, path, subfolder) -> None:
    """A folder of another model family refuses in one line naming the class to load it with. Diffusers
    builds any config with any class, only logging the keys it ignores, and the model then fails inside
    its ``__init__`` (a DiT folder through the Wan class: "TypeError: 'int' object is not iterable")."""
    families = {c.__name__: c for pair in CONVERTED.items() for c in pair}
    if saved is None or saved in (base.__name__, name) or saved not in families:
        return
    where = f"{path}/{subfolder}" if subfolder else str(path)
    library = "mediagen" if families[saved] in CONVERTED.values() else "diffusers"
    raise ValueError(f"{where} holds a {saved} (config.json _class_name), which {name} cannot load: use "
                     f"{library}.{saved}.from_pretrained(path), or mediagen.models.load_transformer(path), "
                     f"which takes the class config.json names")


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

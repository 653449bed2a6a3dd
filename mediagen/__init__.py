"""mediagen: image and video diffusion transformers on MHLA (token-level multi-head linear attention)."""

import importlib
import sys
import types

__version__ = "0.1.0"

# Public names, imported on first use so that ``import mediagen`` stays light (no torch/diffusers).
_EXPORTS = {
    "convert": "mediagen.models.convert",
    "add_text_refiner": "mediagen.models.text_refiner",
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

# The modules whose classes a saved pipeline's model_index.json names as its components' libraries
# (``["mediagen.models.converted", "MHLAWanTransformer3DModel"]``). Diffusers' ``from_pretrained``
# imports no library a folder names: it takes any but its own from ``sys.modules``, so the module must
# be there before the call. ``import mediagen`` puts a stand-in for each there, and on its package, as
# an import would; the first name read from a stand-in (diffusers reads the class) imports the real
# module into that same object, so ``import mediagen`` stays light (no torch, no diffusers) and every
# holder of the stand-in holds the real module. ``mediagen.text.encoders`` imports torch, so it gets a
# stand-in of its own on ``mediagen.text`` (filled by its first import, however it comes).
COMPONENT_MODULES = ("mediagen.models.converted", "mediagen.models.identity_autoencoder",
                     "mediagen.models.byte_text_encoder", "mediagen.text.encoders.encoder")
# packages that import nothing heavy: imported at once, as the parents of the stand-ins
_LIGHT_PACKAGES = ("mediagen.models", "mediagen.text")

_PENDING: dict = {}  # module name -> the stand-in its first import fills


class _Deferred(types.ModuleType):
    """A module standing in before its import. Reading a name it lacks imports the real module into it.
    Dunder names (``__path__``, ``__file__``, ...), which import machinery and tools probe on modules,
    do not trigger the import."""

    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(f"module {self.__name__!r} has no attribute {attr!r}")
        name = self.__name__
        if sys.modules.get(name) is self:
            del sys.modules[name]  # so the import machinery loads it (into this object: _Finder)
        importlib.import_module(name)
        return getattr(self, attr)


class _IntoModule:
    """Loader that runs a module's own loader on the stand-in object."""

    def __init__(self, loader, module):
        self.loader, self.module = loader, module

    def create_module(self, spec):
        self.module.__class__ = types.ModuleType
        return self.module

    def exec_module(self, module):
        module.__loader__ = module.__spec__.loader = self.loader  # source lines in tracebacks, reloads
        self.loader.exec_module(module)


class _Finder:
    """First on ``sys.meta_path`` while stand-ins wait: finds a waiting module as the other finders do,
    to be loaded into its stand-in; leaves ``sys.meta_path`` once none waits."""

    def find_spec(self, fullname, path=None, target=None):
        module = _PENDING.get(fullname)
        if module is None:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if finder is not self and find is not None else None
            if spec is not None:
                del _PENDING[fullname]
                if not _PENDING and self in sys.meta_path:
                    sys.meta_path.remove(self)
                spec.loader = _IntoModule(spec.loader, module)
                return spec
        return None


def _new_stand_in(name: str) -> _Deferred:
    """A ``_Deferred`` for ``name`` with the spec and file its import will give it (``importlib.util.
    find_spec`` reads a listed module's ``__spec__``), from the file layout, importing nothing."""
    import importlib.util
    import os

    module = _PENDING[name] = _Deferred(name)
    path = os.path.join(os.path.dirname(__file__), *name.split(".")[1:])
    if os.path.isdir(path):
        module.__spec__ = importlib.util.spec_from_file_location(name, os.path.join(path, "__init__.py"),
                                                                 submodule_search_locations=[path])
    else:
        module.__spec__ = importlib.util.spec_from_file_location(name, path + ".py")
    module.__file__ = module.__spec__.origin  # tools that map files to modules read it without importing
    return module


def _stand_in(name: str) -> None:
    """A stand-in for module ``name``, in ``sys.modules`` and on its package (importing the light
    packages above it; a heavy one gets a stand-in of its own on its parent, outside sys.modules)."""
    if name in sys.modules:
        return
    module = sys.modules[name] = _new_stand_in(name)
    while "." in name:
        package, _, child = name.rpartition(".")
        if package in sys.modules or package in _LIGHT_PACKAGES:
            setattr(importlib.import_module(package), child, module)
            return
        parent = _PENDING.get(package) or _new_stand_in(package)
        setattr(parent, child, module)
        name, module = package, parent


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())
for _name in COMPONENT_MODULES:
    _stand_in(_name)
del _name


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'mediagen' has no attribute {name!r}")

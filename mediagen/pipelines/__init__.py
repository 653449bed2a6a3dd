"""Diffusers pipelines for class-conditional images, text-to-image and text-to-video, plus
``mediagen generate``. Names are imported on first use."""

import importlib

_EXPORTS = {
    "ClassConditionalImagePipeline": ".class_image",
    "TextToVideoPipeline": ".text_video",
    "TextToImagePipeline": ".text_image",
    "VideoPipelineOutput": ".outputs",
    "make_scheduler": ".schedulers",
    "SCHEDULERS": ".schedulers",
    "RUNTIMES": ".runtime",
    "build_pipeline": ".building",
    "save_media": ".export",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

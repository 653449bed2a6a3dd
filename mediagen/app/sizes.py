"""Output sizes and token grids of the served models (what the limits and the MHLA blocks depend on)."""

from __future__ import annotations

from dataclasses import dataclass

from ..pipelines.vae_utils import vae_factors


@dataclass(frozen=True)
class VideoGeometry:
    stride_t: int        # frames per latent frame (temporal autoencoder factor)
    stride_h: int        # pixels per token along height (spatial factor x patch)
    stride_w: int
    patch_t: int


def video_geometry(cache) -> VideoGeometry:
    pipe = cache.base("video")
    t, s = vae_factors(pipe.vae)
    p_t, p_h, p_w = pipe.transformer.config.patch_size
    return VideoGeometry(t, s * p_h, s * p_w, p_t)


def image_side(cache) -> int:
    """The class-conditional model's output side (DiT samples square images of one size)."""
    pipe = cache.base("image")
    return pipe.transformer.config.sample_size * vae_factors(pipe.vae)[1]


def image_stride(cache) -> int:
    pipe = cache.base("image")
    return vae_factors(pipe.vae)[1] * pipe.transformer.config.patch_size


def video_grid(cache, frames: int, height: int, width: int) -> tuple[int, int, int]:
    g = video_geometry(cache)
    latent_frames = (frames - 1) // g.stride_t + 1
    return (latent_frames // g.patch_t, height // g.stride_h, width // g.stride_w)


def image_grid(cache) -> tuple[int, int]:
    side = image_side(cache) // image_stride(cache)
    return (side, side)


def default_video_size(cache) -> dict:
    """{"frames", "height", "width"}: the source's own size, else 9 frames of 8x8 tokens."""
    g = video_geometry(cache)
    size = dict(cache.models.video.size)
    size.setdefault("frames", 8 * g.stride_t + 1 if g.stride_t > 1 else 9)
    size.setdefault("height", 8 * g.stride_h)
    size.setdefault("width", 8 * g.stride_w)
    return size


def default_grid(cache, family: str):
    if family == "image":
        return image_grid(cache)
    size = default_video_size(cache)
    return video_grid(cache, size["frames"], size["height"], size["width"])

"""Choose the dataset a config names, and batch items into tensors."""

from __future__ import annotations

import torch

from .image_folder import ImageFolderDataset
from .latent_cache import LatentCacheDataset
from .mnist import MNISTDataset
from .moving_mnist import MovingMNISTDataset
from .video_folder import VideoFolderDataset
from .wordings import VariedCaptions


def build_dataset(data, task: str, seed: int = 0):
    """data: the ``DataConfig`` section; task: the model's task (decides labels vs captions)."""
    text = task != "class-to-image"
    if data.dataset == "mnist":
        if task == "text-to-video":
            raise ValueError("data.dataset='mnist' gives images; task='text-to-video' needs 'moving-mnist' "
                             "or 'video-folder'")
        return MNISTDataset(data.split, data.resolution, data.channels, captions=text)
    if not text:
        raise ValueError(f"data.dataset={data.dataset!r} has captions, not class labels; task='class-to-image' "
                         f"needs data.dataset='mnist'; to fine-tune a shipped model on captioned images use "
                         f"task=text-to-image with model.pretrained=video-mhla (or video-sdpa)")
    if data.dataset == "moving-mnist":
        clips = MovingMNISTDataset(resolution=data.resolution, num_frames=data.num_frames, num_digits=data.num_digits,
                                   speed=data.speed, length=data.length, channels=data.channels, split=data.split,
                                   seed=seed, static_fraction=data.static_fraction,
                                   frame_buckets=data.frame_buckets, resolution_buckets=data.resolution_buckets,
                                   two_digit_fraction=data.two_digit_fraction)
        return VariedCaptions(clips, data.varied_captions, seed) if data.varied_captions else clips
    if data.dataset == "latent-cache":
        return LatentCacheDataset(data.cache_dir)
    if data.dataset == "image-folder":
        return ImageFolderDataset(data.path, resolution=data.resolution, channels=data.channels,
                                  resolution_buckets=data.resolution_buckets)
    return VideoFolderDataset(data.path, num_frames=data.num_frames, resolution=data.resolution,
                              channels=data.channels, frame_buckets=data.frame_buckets,
                              resolution_buckets=data.resolution_buckets, bad_videos=data.bad_videos)


def collate(items: list[dict]) -> dict:
    """Stack pixels (or the latents of encoded clips); labels become a tensor, captions stay a list; ``index`` is kept
    for caches."""
    batch = {"pixels": torch.stack([it["pixels"] for it in items])} if "pixels" in items[0] else {}
    if "label" in items[0]:
        batch["label"] = torch.tensor([it["label"] for it in items])
    for key in ("caption", "template_caption"):
        if key in items[0]:
            batch[key] = [it[key] for it in items]
    for key in ("latents", "text_embeds", "text_mask"):
        if key in items[0]:
            batch[key] = torch.stack([it[key] for it in items])
    return batch

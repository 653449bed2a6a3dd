"""Turning a batch into the transformer's inputs: latents from pixels, text states from captions,
with optional on-disk caches of both (``data.cache_dir``).

Latents are normalised the way ``mediagen.pipelines.vae_utils.latents_to_vae`` undoes:
Wan's per-channel (z - mean) / std, or (z - shift) * scaling_factor; pixel space passes through.
Text states come from ``mediagen.pipelines.prompt_encoding.encode_prompts``, the same call the
pipelines make at sampling time, so training and inference see identical conditioning.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..models.identity_autoencoder import IdentityAutoencoder
from ..pipelines.prompt_encoding import encode_prompts


def _key(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def _atomic_save(tensors: dict, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    save_file(tensors, str(tmp))
    tmp.replace(path)


@torch.no_grad()
def encode_latents(vae, pixels: torch.Tensor) -> torch.Tensor:
    """pixels in [-1, 1], (B, C, H, W) or (B, C, F, H, W) -> the transformer's latents."""
    if isinstance(vae, IdentityAutoencoder):
        return pixels
    z = vae.encode(pixels.to(vae.dtype)).latent_dist.mode().float()
    cfg = vae.config
    if getattr(cfg, "latents_mean", None) is not None:  # AutoencoderKLWan
        shape = (1, -1) + (1,) * (z.dim() - 2)
        mean = torch.tensor(cfg.latents_mean, device=z.device).view(shape)
        std = torch.tensor(cfg.latents_std, device=z.device).view(shape)
        return (z - mean) / std
    return (z - (getattr(cfg, "shift_factor", None) or 0.0)) * getattr(cfg, "scaling_factor", 1.0)


class Conditioner:
    """Encodes captions and pixels, through the caches when ``cache_dir`` is set."""

    def __init__(self, components, max_length: int, cache_dir: str | None, tag: str):
        self.c = components
        self.max_length = max_length
        self.cache = Path(cache_dir) if cache_dir else None
        self.tag = tag
        self.text_table: dict[str, torch.Tensor] = {}
        self._rows: dict[str, int] = {}                   # caption key -> row of the stacked table
        self._stacked: dict[str, torch.Tensor] = {}       # device -> (captions, L, C) table
        if self.cache is not None:
            (self.cache / f"latents-{tag}").mkdir(parents=True, exist_ok=True)

    # --- text ----------------------------------------------------------------------------
    @torch.no_grad()
    def _encode_text(self, captions: list[str], device) -> torch.Tensor:
        enc = self.c.text_encoder
        hidden, _ = encode_prompts(enc, self.c.tokenizer, captions, self.max_length, device, torch.float32)
        return hidden

    def precompute_text(self, captions: list[str], device, batch: int = 64) -> None:
        """Fill the text cache (file ``text-<tag>.safetensors``) with every caption the data can have."""
        if self.cache is None:
            return
        path = self.cache / f"text-{self.tag}.safetensors"
        table = load_file(str(path)) if path.is_file() else {}
        todo = [c for c in dict.fromkeys(list(captions) + [""]) if _key(c) not in table]
        for i in range(0, len(todo), batch):
            chunk = todo[i:i + batch]
            for c, h in zip(chunk, self._encode_text(chunk, device).cpu()):
                table[_key(c)] = h.contiguous()
        if todo:
            _atomic_save(table, path)
        self.text_table = table
        self._rows = {k: i for i, k in enumerate(table)}
        self._stacked = {}

    def text_states(self, captions: list[str], device) -> torch.Tensor:
        if self.text_table:
            rows = [self._rows.get(_key(c)) for c in captions]
            if None not in rows:
                # one gather from the table kept on the device, not a stack and copy per step
                key = str(device)
                if key not in self._stacked:
                    self._stacked[key] = torch.stack(list(self.text_table.values())).to(device)
                table = self._stacked[key]
                return table[torch.tensor(rows, device=table.device)]
        return self._encode_text(captions, device)

    # --- latents -------------------------------------------------------------------------
    def latents(self, pixels: torch.Tensor, indices: list[int], device) -> torch.Tensor:
        vae = self.c.vae
        if isinstance(vae, IdentityAutoencoder):
            return pixels.to(device)
        if self.cache is None:
            return encode_latents(vae, pixels.to(device))
        folder = self.cache / f"latents-{self.tag}"
        files = [folder / f"{i}.safetensors" for i in indices]
        if all(f.is_file() for f in files):
            return torch.stack([load_file(str(f))["latents"] for f in files]).to(device)
        z = encode_latents(vae, pixels.to(device))
        for f, zi in zip(files, z.cpu()):
            _atomic_save({"latents": zi.contiguous()}, f)
        return z

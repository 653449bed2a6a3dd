"""Clips already encoded: the transformer's latents and the captions' text states on disk, in the layout
the trainer's own cache keeps them (``data.cache_dir``, training/conditioning.py), with an index of the clips.
``data.dataset: latent-cache`` trains on such a folder: no video is decoded and no VAE runs in the loop.

    <cache_dir>/clips.jsonl                     one line per clip, in index order: {"latents": the file below,
                                                relative to cache_dir, "caption": str, "shape": [C, F, h, w]}
    <cache_dir>/latents-<tag>/<i>.safetensors   {"latents": (C, F, h, w) float32}, normalised as the trainer
                                                normalises a VAE's latents (Wan: (z - mean) / std per channel)
    <cache_dir>/text-<tag>.safetensors          {sha1(caption): (L, C_text) float32} for every caption and "",
                                                padding rows zero (as ``encode_prompts`` gives them)

``<tag>`` is the run's cache key, "<text encoder>-<vae>-<seed>-<text_max_length>" (``cache_tag``): the
trainer reads text-<tag> as its text cache, so captions are not encoded again when the tag is the run's,
and encodes (and caches) them itself when it is not.

``write_synthetic_clips`` fills a folder with random clips at any size: 81 frames at 480x832 are
16 x 21 x 60 x 104 Wan latents, 21 x 30 x 52 = 32,760 tokens at patch 1x2x2; 720x1280 gives 75,600.
Random N(0, 1) latents have the statistics of normalised ones, so a run on them costs what a real run
costs (memory, time, bytes), and learns nothing. ``write_stand_in_pipeline`` writes a diffusers Wan2.1
pipeline folder (model_index.json, transformer/, vae/, text_encoder/ a UMT5 encoder, tokenizer/, scheduler/)
with random weights, the layout of Wan2.1-T2V-1.3B-Diffusers, for a config's ``model.pretrained`` where the
real checkpoint is not on disk. From the repository root:

    python -m mediagen.training.data.latent_cache stand-in /data/wan-stand-in --scale wan2.1-1.3b
    python -m mediagen.training.data.latent_cache clips configs/train/wan2.1-1.3b-mhla-finetune.yaml \\
        model.pretrained=/data/wan-stand-in data.cache_dir=/data/synthetic-480p --clips 64 --sizes 81x480x832
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch.utils.data import Dataset

INDEX = "clips.jsonl"
SCALES = ("tiny", "wan2.1-1.3b")


def _caption_key(text: str) -> str:
    """The text cache's key of a caption (the trainer's, training/conditioning.py)."""
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def _save(tensors: dict, path: Path) -> None:
    """Written under a temporary name and renamed: a kill never leaves half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    save_file(tensors, str(tmp))
    tmp.replace(path)


class LatentCacheDataset(Dataset):
    """The clips of a latent-cache folder (module doc) as {"latents": (C, F, h, w), "caption": str}; clips of
    one latent shape share a bucket. Every file is checked at start-up, so a missing one fails at load with
    its name, not hours into a run."""

    def __init__(self, cache_dir: str | Path):
        folder = Path(cache_dir) if cache_dir else None
        if folder is None or not (folder / INDEX).is_file():
            raise ValueError(f"data.cache_dir={str(cache_dir)!r} holds no {INDEX}: with data.dataset='latent-cache' "
                             f"it must be a folder of encoded clips (python -m mediagen.training.data.latent_cache "
                             f"clips CONFIG writes random ones)")
        self.folder = folder
        self.files, self.captions, self.shapes = [], [], []
        for n, line in enumerate((folder / INDEX).read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                file, caption, shape = folder / row["latents"], row["caption"], tuple(int(s) for s in row["shape"])
            except (ValueError, KeyError, TypeError) as err:
                raise ValueError(f"{folder / INDEX} line {n}: {line[:80]!r} is not "
                                 f'{{"latents": FILE, "caption": TEXT, "shape": [C, F, h, w]}} ({err})') from None
            if not isinstance(caption, str) or len(shape) != 4 or min(shape) < 1:
                raise ValueError(f"{folder / INDEX} line {n}: caption must be a string and shape four sizes >= 1; "
                                 f"got caption={caption!r}, shape={list(shape)}")
            if not file.is_file():
                raise ValueError(f"{folder / INDEX} line {n} names {row['latents']!r} but {file} does not exist")
            self.files.append(file)
            self.captions.append(caption)
            self.shapes.append(shape)
        if not self.files:
            raise ValueError(f"{folder / INDEX} lists no clips")
        self.keys = sorted(set(self.shapes))

    def __len__(self) -> int:
        return len(self.files)

    def bucket_ids(self) -> list[int]:
        return [self.keys.index(s) for s in self.shapes]

    def num_buckets(self) -> int:
        """One bucket per latent shape present, in sorted order."""
        return len(self.keys)

    def __getitem__(self, i: int) -> dict:
        z = load_file(str(self.files[i]))["latents"]
        if tuple(z.shape) != self.shapes[i]:
            raise ValueError(f"{self.files[i]} holds latents of shape {list(z.shape)}; {INDEX} says "
                             f"{list(self.shapes[i])}")
        return {"latents": z.float(), "caption": self.captions[i]}

    def all_captions(self) -> list[str]:
        return sorted(set(self.captions))


def latent_shape(frames: int, height: int, width: int, channels: int, vae_scale=(4, 8, 8), patch=(1, 2, 2)):
    """(C, F', h, w) latents of a clip of ``frames`` x ``height`` x ``width`` pixels. The VAE keeps the first
    frame and compresses the rest by vae_scale[0] (Wan: 4k + 1 frames), and the transformer cuts the latents
    into patches, so the sizes must fit both."""
    t, s_h, s_w = vae_scale
    if frames < 1 or (frames - 1) % t:
        raise ValueError(f"frames={frames} is not allowed: use {t}k + 1 frames (the VAE compresses time by {t} "
                         f"after the first frame), e.g. 81")
    for name, value, s, p in (("height", height, s_h, patch[1]), ("width", width, s_w, patch[2])):
        if value < 1 or value % (s * p):
            raise ValueError(f"{name}={value} is not allowed: use a positive multiple of {s * p} (autoencoder "
                             f"factor {s} x patch {p})")
    lat_f = (frames - 1) // t + 1
    if lat_f % patch[0]:
        raise ValueError(f"frames={frames} gives {lat_f} latent frames, not a multiple of the patch's {patch[0]}")
    return channels, lat_f, height // s_h, width // s_w


def write_synthetic_clips(cache_dir: str | Path, *, clips: int, sizes, channels: int, text_dim: int,
                          text_length: int, tag: str, vae_scale=(4, 8, 8), patch=(1, 2, 2), seed: int = 0,
                          captions=None) -> Path:
    """Write ``clips`` random clips into ``cache_dir`` (module doc): latents N(0, 1) of each size in
    ``sizes`` ((frames, height, width) in pixels, clip i gets sizes[i % len(sizes)]) and random text
    states (the caption's words and an end token, the rest zero padding) for every caption and "". Clip i
    and caption c are the same numbers for the same seed, whatever else is written. Returns cache_dir."""
    for name, value in (("clips", clips), ("channels", channels), ("text_dim", text_dim),
                        ("text_length", text_length)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} is not allowed: use an int >= 1")
    sizes = [tuple(int(x) for x in s) for s in sizes]
    if not sizes or any(len(s) != 3 for s in sizes):
        raise ValueError(f"sizes={sizes!r} is not allowed: use a list of (frames, height, width)")
    shapes = [latent_shape(*s, channels, vae_scale, patch) for s in sizes]
    captions = list(captions) if captions else [f"synthetic clip {i}: a red fox running through a snowy forest"
                                                for i in range(min(clips, 8))]
    folder = Path(cache_dir)
    latents = folder / f"latents-{tag}"
    latents.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(clips):
        shape = shapes[i % len(shapes)]
        z = torch.randn(shape, generator=torch.Generator().manual_seed(seed * 1_000_003 + i))
        _save({"latents": z.contiguous()}, latents / f"{i}.safetensors")
        rows.append({"latents": f"latents-{tag}/{i}.safetensors", "caption": captions[i % len(captions)],
                     "shape": list(shape)})
    table = {}
    for c in dict.fromkeys([*captions, ""]):
        g = torch.Generator().manual_seed(int(_caption_key(c)[:12], 16) + seed)
        states = torch.zeros(text_length, text_dim)
        used = min(text_length, len(c.split()) + 1)  # its words and the end token; the rest is padding
        states[:used] = torch.randn(used, text_dim, generator=g)
        table[_caption_key(c)] = states
    _save(table, folder / f"text-{tag}.safetensors")
    tmp = folder / f".{INDEX}.{os.getpid()}.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.replace(folder / INDEX)
    return folder


def cache_tag(cfg, text_encoder_name: str) -> str:
    """The trainer's cache key of a run (training/trainer.py): text encoder, autoencoder, seed, text length."""
    tag = f"{text_encoder_name}-{cfg.model.vae or 'pixels'}-{cfg.train.seed}-{cfg.model.text_max_length}"
    return tag.replace("/", "_")


def _text_encoder_name(cfg) -> str:
    """The name ``build_components`` gives the run's text encoder, read from the config and the pretrained
    folder without loading a model."""
    from ..components import _own_encoder, pretrained_folder

    name = cfg.model.text_encoder
    pretrained = pretrained_folder(cfg.model.pretrained) if cfg.model.pretrained is not None else None
    if name not in (None, "pipeline"):
        return name
    own = _own_encoder(pretrained)
    if own is None:
        return "byte"
    if own[0] == "ref":
        return own[1]
    meta = json.loads((pretrained / "text_encoder" / "config.json").read_text())
    return "byte" if meta.get("_class_name") == "ByteTextEncoder" else "pipeline"


def _model_shapes(cfg) -> dict:
    """The sizes the latents and text states must have for this config's model: latent channels, text width,
    patch and the autoencoder's factors."""
    from omegaconf import OmegaConf

    from ...models.presets import preset
    from ..components import pretrained_folder

    if cfg.model.pretrained is not None:
        folder = pretrained_folder(cfg.model.pretrained)
        sub = folder / "transformer" if (folder / "model_index.json").is_file() else folder
        config = json.loads((sub / "config.json").read_text())
    else:
        config = dict(preset(cfg.model.preset)["config"], **OmegaConf.to_container(cfg.model.overrides))
    patch = tuple(config.get("patch_size") or (1, 1, 1))
    vae_scale = (1, 1, 1)
    if cfg.model.vae is not None:
        folder = (pretrained_folder(cfg.model.pretrained) / "vae" if cfg.model.vae == "pipeline"
                  else Path(cfg.model.vae))
        vae = json.loads((folder / "config.json").read_text())
        if "temperal_downsample" in vae:  # AutoencoderKLWan: one spatial halving per entry, temporal where true
            steps = vae["temperal_downsample"]
            temporal, spatial = 2 ** sum(map(bool, steps)), 2 ** len(steps)
        else:  # AutoencoderKL: images
            temporal, spatial = 1, 2 ** (len(vae.get("block_out_channels", [0])) - 1)
        temporal = vae.get("scale_factor_temporal") or temporal
        spatial = vae.get("scale_factor_spatial") or spatial
        vae_scale = (temporal, spatial, spatial)
    return {"channels": config["in_channels"], "text_dim": config["text_dim"], "patch": patch,
            "vae_scale": vae_scale}


def write_stand_in_pipeline(folder: str | Path, scale: str = "tiny", seed: int = 0) -> Path:
    """A diffusers Wan2.1 text-to-video pipeline folder with random weights (module doc). ``scale``:
    "wan2.1-1.3b" has Wan2.1-T2V-1.3B's transformer (1.42B parameters) and Wan's VAE, with a one-layer UMT5
    encoder of UMT5-XXL's width (4096) and a word-level tokenizer in place of the 5.7B-parameter UMT5-XXL;
    "tiny" is small everywhere (a CPU test). Returns the folder."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast, UMT5Config, UMT5EncoderModel

    from ...models.presets import build_transformer

    if scale not in SCALES:
        raise ValueError(f"scale={scale!r} is not allowed: use one of {list(SCALES)}")
    words = ["<pad>", "</s>", "<unk>"] + sorted(set(
        "a an the of in on at to and with red fox running through snowy forest cinematic synthetic clip digit "
        "moves left right up down 0 1 2 3 4 5 6 7 8 9".split()))
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
    torch.manual_seed(seed)
    if scale == "tiny":
        vae = AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                               latents_mean=[0.0] * 4, latents_std=[1.0] * 4)
        text = UMT5Config(vocab_size=len(words), d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4)
        transformer = build_transformer("wan-tiny", in_channels=4, out_channels=4, text_dim=32)
    else:
        vae = AutoencoderKLWan()  # Wan2.1's VAE: z_dim 16, 4 x 8 x 8
        text = UMT5Config(vocab_size=len(words), d_model=4096, d_kv=64, d_ff=10240, num_layers=1, num_heads=64,
                          feed_forward_proj="gated-gelu")
        transformer = build_transformer("wan2.1-1.3b")
    pipe = WanPipeline(tokenizer=tokenizer, text_encoder=UMT5EncoderModel(text).eval(), vae=vae.eval(),
                       transformer=transformer.eval(),
                       scheduler=UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                                         flow_shift=3.0))
    folder = Path(folder)
    pipe.save_pretrained(str(folder), safe_serialization=True)
    return folder


def _size(text: str) -> tuple[int, int, int]:
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"--sizes entry {text!r} is not FRAMESxHEIGHTxWIDTH (e.g. 81x480x832)")
    return tuple(int(p) for p in parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mediagen.training.data.latent_cache",
                                 description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("clips", help="random clips into the config's data.cache_dir, sized for its model")
    c.add_argument("config", help="training YAML (the run that will read the clips)")
    c.add_argument("overrides", nargs="*", help="dotlist overrides, as `mediagen train` takes them")
    c.add_argument("--clips", type=int, default=16, help="number of clips (default 16)")
    c.add_argument("--sizes", default="81x480x832", help="comma list of FRAMESxHEIGHTxWIDTH in pixels")
    c.add_argument("--seed", type=int, default=0)
    s = sub.add_parser("stand-in", help="a random-weight Wan2.1 diffusers pipeline folder for model.pretrained")
    s.add_argument("folder")
    s.add_argument("--scale", default="tiny", choices=SCALES)
    s.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    try:
        if args.command == "stand-in":
            print(f"wrote {write_stand_in_pipeline(args.folder, args.scale, args.seed)}")
            return 0
        from ..config import load_config

        cfg = load_config(args.config, args.overrides)
        if not cfg.data.cache_dir:
            raise ValueError("data.cache_dir is not set: give the folder to write (data.cache_dir=...)")
        shapes = _model_shapes(cfg)
        tag = cache_tag(cfg, _text_encoder_name(cfg))
        folder = write_synthetic_clips(cfg.data.cache_dir, clips=args.clips,
                                       sizes=[_size(x) for x in args.sizes.split(",")],
                                       text_length=cfg.model.text_max_length, tag=tag, seed=args.seed, **shapes)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    tokens = {math.prod(s[1:]) // math.prod(shapes["patch"]) for s in LatentCacheDataset(folder).shapes}
    print(f"wrote {args.clips} clips ({sorted(tokens)} tokens each) and their text states (tag {tag}) to {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Named model configs: diffusers ``config.json`` contents for the transformers we train and benchmark.

Small ones work in pixel space (with ``IdentityAutoencoder``) so they train on a single GPU and run
on a CPU; the large ones reproduce published sizes for benchmarks (random weights). Each preset is
a plain dict, so it can be written as JSON (``write_preset_json``) or edited before building.

    dit-mnist       the shipped default: 6 x 192 (3 heads of 64), class-conditional 28x28x1, patch 2
                    -> 14x14 tokens, 4.0M parameters (8 MB in fp16)
    dit-s-mnist     DiT-S-like (12 x 384, 6 heads), class-conditional 28x28x1, patch 2 -> 14x14 tokens
    dit-s-cifar     the same width/depth for 32x32x3, patch 2 -> 16x16 tokens
    dit-tiny        2 layers x 32, for tests
    dit-xl-2-256    DiT-XL/2 on 32x32x4 latents (256 px through an SD VAE); dit-xl-2-512: 64x64
    wan-mmnist      small Wan-style text-to-video for Moving-MNIST (the shipped default): 8 x 384
                    (6 heads of 64, FFN 1024), 16 frames 64x64x1, patch (1,8,8) -> 16x8x8 tokens, text
                    from a 384-wide encoder (MiniLM's width), 17.3M parameters (35 MB in fp16). Patches
                    of 8x8 pixels (64 values, well under the width) and one frame per token: a wide model
                    on 1,024 tokens learns more per GPU-second than a narrow one on 4,096, and a
                    one-frame grid (text-to-image) still works
    wan-tiny        2 layers x 32, for tests
    wan2.1-1.3b     Wan2.1-T2V-1.3B (1.42B params)
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

# each preset: "class" (diffusers class), "task" (which pipeline serves it), "config" (its config.json)
_DIT_S = dict(num_attention_heads=6, attention_head_dim=64, num_layers=12, patch_size=2, dropout=0.0,
              norm_type="ada_norm_zero", activation_fn="gelu-approximate", attention_bias=True)
_WAN_BASE = dict(patch_size=[1, 2, 2], freq_dim=256, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
                 eps=1e-6, rope_max_seq_len=1024)

PRESETS: dict[str, dict] = {
    "dit-mnist": {"class": "DiTTransformer2DModel", "task": "class-to-image", "num_classes": 10,
                  "config": dict(_DIT_S, num_attention_heads=3, attention_head_dim=64, num_layers=6, in_channels=1,
                                 out_channels=1, sample_size=28, num_embeds_ada_norm=10)},
    "dit-s-mnist": {"class": "DiTTransformer2DModel", "task": "class-to-image", "num_classes": 10,
                    "config": dict(_DIT_S, in_channels=1, out_channels=1, sample_size=28, num_embeds_ada_norm=10)},
    "dit-s-cifar": {"class": "DiTTransformer2DModel", "task": "class-to-image", "num_classes": 10,
                    "config": dict(_DIT_S, in_channels=3, out_channels=3, sample_size=32, num_embeds_ada_norm=10)},
    "dit-tiny": {"class": "DiTTransformer2DModel", "task": "class-to-image", "num_classes": 10,
                 "config": dict(_DIT_S, num_attention_heads=2, attention_head_dim=16, num_layers=2, in_channels=1,
                                out_channels=1, sample_size=8, num_embeds_ada_norm=10)},
    "dit-xl-2-256": {"class": "DiTTransformer2DModel", "task": "class-to-image", "num_classes": 1000,
                     "config": dict(_DIT_S, num_attention_heads=16, attention_head_dim=72, num_layers=28,
                                    in_channels=4, out_channels=8, sample_size=32, num_embeds_ada_norm=1000)},
    "dit-xl-2-512": {"class": "DiTTransformer2DModel", "task": "class-to-image", "num_classes": 1000,
                     "config": dict(_DIT_S, num_attention_heads=16, attention_head_dim=72, num_layers=28,
                                    in_channels=4, out_channels=8, sample_size=64, num_embeds_ada_norm=1000)},
    "wan-mmnist": {"class": "WanTransformer3DModel", "task": "text-to-video", "frames": 16, "height": 64,
                   "width": 64,
                   "config": dict(_WAN_BASE, patch_size=[1, 8, 8], num_attention_heads=6, attention_head_dim=64,
                                  in_channels=1, out_channels=1, text_dim=384, ffn_dim=1024, num_layers=8)},
    "wan-tiny": {"class": "WanTransformer3DModel", "task": "text-to-video", "frames": 3, "height": 8, "width": 8,
                 "config": dict(_WAN_BASE, num_attention_heads=2, attention_head_dim=16, in_channels=1,
                                out_channels=1, text_dim=32, ffn_dim=64, num_layers=2)},
    "wan2.1-1.3b": {"class": "WanTransformer3DModel", "task": "text-to-video", "frames": 81, "height": 480,
                    "width": 832, "vae_scale": [4, 8, 8],
                    "config": dict(_WAN_BASE, num_attention_heads=12, attention_head_dim=128, in_channels=16,
                                   out_channels=16, text_dim=4096, ffn_dim=8960, num_layers=30)},
}


def preset(name: str) -> dict:
    """A deep copy of the named preset: {"class", "task", "config", ...}."""
    if name not in PRESETS:
        raise ValueError(f"preset={name!r} is not known: use one of {sorted(PRESETS)}")
    return copy.deepcopy(PRESETS[name])


def build_transformer(name_or_config: str | dict, **overrides):
    """A randomly initialised diffusers transformer from a preset name or a preset dict."""
    from diffusers import DiTTransformer2DModel, WanTransformer3DModel

    p = preset(name_or_config) if isinstance(name_or_config, str) else copy.deepcopy(name_or_config)
    classes = {"DiTTransformer2DModel": DiTTransformer2DModel, "WanTransformer3DModel": WanTransformer3DModel}
    if p.get("class") not in classes:
        raise ValueError(f"preset class={p.get('class')!r} is not allowed: use one of {sorted(classes)}")
    config = dict(p["config"], **overrides)
    if "patch_size" in config and isinstance(config["patch_size"], list):
        config["patch_size"] = tuple(config["patch_size"])
    return classes[p["class"]](**config)


def write_preset_json(name: str, path: str | Path) -> Path:
    """Write a preset as JSON (what a training config can point to)."""
    path = Path(path)
    path.write_text(json.dumps(preset(name), indent=2))
    return path

"""Tiny random diffusers transformers built from the presets, and helpers to recompute a layer."""

import torch

from mediagen.models.presets import build_transformer


def tiny_wan(num_layers=3, seed=0, **overrides):
    torch.manual_seed(seed)
    return build_transformer("wan-tiny", num_layers=num_layers, **overrides).eval()


def tiny_dit(num_layers=3, seed=0, **overrides):
    torch.manual_seed(seed)
    return build_transformer("dit-tiny", num_layers=num_layers, **overrides).eval()


def wan_inputs(batch=2, frames=3, height=8, width=12, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 1, frames, height, width, generator=g)
    t = torch.linspace(50, 900, batch)
    text = torch.randn(batch, 5, 32, generator=g)
    return dict(hidden_states=x, timestep=t, encoder_hidden_states=text)


def dit_inputs(batch=2, side=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 1, side, side, generator=g)
    return dict(hidden_states=x, timestep=torch.tensor([10, 700][:batch] + [5] * max(0, batch - 2)),
                class_labels=torch.arange(batch) % 10)


def wan_qkv(attn, x):
    """q, k, v (B, N, H, D) of a WanAttention self-attention layer, computed from its weights."""
    q, k, v = attn.norm_q(attn.to_q(x)), attn.norm_k(attn.to_k(x)), attn.to_v(x)
    return [t.unflatten(2, (attn.heads, -1)) for t in (q, k, v)]


def dit_qkv(attn, x):
    B, N, _ = x.shape
    return [lin(x).view(B, N, attn.heads, -1) for lin in (attn.to_q, attn.to_k, attn.to_v)]


def capture_attn1(model, blocks_attr):
    """Forward hooks recording (input hidden_states, output, rotary_emb) of every attn1."""
    records = []
    handles = []
    for block in getattr(model, blocks_attr):
        def hook(module, args, kwargs, output, store=records):
            x = args[0] if args else kwargs["hidden_states"]
            rope = args[3] if len(args) > 3 else kwargs.get("rotary_emb")
            store.append((module, x.detach(), output.detach(), rope))
        handles.append(block.attn1.register_forward_hook(hook, with_kwargs=True))
    return records, handles


def tiny_sana(num_layers=2, seed=0, **overrides):
    """A tiny random diffusers SanaTransformer2DModel (ReLU linear self-attention, Mix-FFN)."""
    from diffusers import SanaTransformer2DModel

    torch.manual_seed(seed)
    config = dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16, num_layers=num_layers,
                  num_cross_attention_heads=2, cross_attention_head_dim=16, cross_attention_dim=32,
                  caption_channels=24, sample_size=8, patch_size=1)
    config.update(overrides)
    return SanaTransformer2DModel(**config).eval()


def sana_inputs(batch=2, height=8, width=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    return dict(hidden_states=torch.randn(batch, 4, height, width, generator=g),
                encoder_hidden_states=torch.randn(batch, 5, 24, generator=g),
                timestep=torch.linspace(50, 900, batch))


def sana_qkv(attn, x):
    """q, k, v (B, N, H, D) of SANA's self-attention layer (no q/k norm in the tiny model)."""
    return [lin(x).unflatten(2, (attn.heads, -1)) for lin in (attn.to_q, attn.to_k, attn.to_v)]

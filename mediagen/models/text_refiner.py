"""A small trainable self-attention over a Wan model's text states, run before its text projection.

Frozen sentence encoders such as MiniLM give a word nearly the same state whatever else the prompt
says: in "the digit 3 moves left while the digit 8 moves down" the state of "3" barely depends on
its direction (cosine 0.998 between "3 moves left" and "3 moves down", ``benchmarks/text_binding.py``) and the direction's barely on
its digit. Which digit goes with which way is then carried mostly by token position, which the video
model's cross-attention cannot pair. ``TextRefiner`` (pre-norm transformer blocks, as HunyuanVideo's
token refiner) lets each text token take in its neighbours first, so a digit's state can carry its
own direction.

Rules:

- Every residual branch ends in a zero-initialised projection, so a fresh refiner is the identity: a
  model that gains one computes exactly what it computed before, and a fine-tune starts from its outputs.
- Padding: the pipelines pass padded text positions as all-zero rows. A row that is exactly zero is
  padding: it is masked as a key (its content never reaches a real token) and stays exactly zero in the
  output (each block's output is multiplied by the mask). A sequence with no real token attends to all of
  its (zero) rows, so nothing divides by an empty softmax; its output is zero anyway.
- The mask is computed from tensor values with tensor ops only (no Python branch on them), so the module
  runs under torch.compile and bf16 autocast.

``add_text_refiner(model)`` adds one to a loaded Wan transformer in place. It runs as a forward pre-hook
on ``condition_embedder.text_embedder``, so every existing weight keeps its state-dict key; only
``text_refiner.*`` is new. The model's config records it (``mediagen_text_refiner``), so
``save_pretrained`` / ``from_pretrained`` (and ``mediagen.models.load_transformer``) rebuild it before
its weights load.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .attention_registry import is_int

CONFIG_KEY = "mediagen_text_refiner"


def refiner_options(dim: int, layers=1, heads=None, mlp_ratio=2.0) -> dict:
    """The checked options {"layers", "heads", "mlp_ratio"}; a bad value raises a one-line ValueError."""
    if not is_int(layers) or layers < 1:
        raise ValueError(f"layers={layers!r} is not allowed: use an int >= 1")
    if heads is None:
        heads = max(1, dim // 64)
    if not is_int(heads) or heads < 1 or dim % heads:
        raise ValueError(f"heads={heads!r} is not allowed: use an int >= 1 that divides the text width {dim}")
    if isinstance(mlp_ratio, bool) or not isinstance(mlp_ratio, (int, float)) or not mlp_ratio > 0 \
            or mlp_ratio == float("inf"):
        raise ValueError(f"mlp_ratio={mlp_ratio!r} is not allowed: use a finite number > 0")
    if int(dim * mlp_ratio) < 1:
        raise ValueError(f"mlp_ratio={mlp_ratio!r} is not allowed: the MLP width int({dim} * mlp_ratio) must be >= 1")
    return {"layers": int(layers), "heads": int(heads), "mlp_ratio": float(mlp_ratio)}


class RefinerBlock(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: float):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        hidden = int(dim * mlp_ratio)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        for out in (self.proj, self.fc2):  # zero residual branches: the block starts as the identity
            nn.init.zeros_(out.weight)
            nn.init.zeros_(out.bias)

    def forward(self, x: torch.Tensor, keep: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        x = (x + self.proj(a.transpose(1, 2).reshape(b, n, d))) * keep
        return (x + self.fc2(F.gelu(self.fc1(self.norm2(x))))) * keep


class TextRefiner(nn.Module):
    """``layers`` pre-norm self-attention blocks over text states (B, L, dim); identity when fresh.
    An all-zero row is padding: masked as a key and kept exactly zero."""

    def __init__(self, dim: int, layers: int = 1, heads: int | None = None, mlp_ratio: float = 2.0):
        super().__init__()
        opts = refiner_options(dim, layers, heads, mlp_ratio)
        self.dim, self.heads, self.mlp_ratio = dim, opts["heads"], opts["mlp_ratio"]
        self.blocks = nn.ModuleList(RefinerBlock(dim, opts["heads"], opts["mlp_ratio"]) for _ in range(opts["layers"]))

    def options(self) -> dict:
        return {"layers": len(self.blocks), "heads": self.heads, "mlp_ratio": self.mlp_ratio}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        real = (x != 0).any(dim=-1)                                     # (B, L): not padding
        # a sequence without a real token attends to all its rows (no empty softmax); its output is zeroed
        attn_mask = (real | ~real.any(dim=-1, keepdim=True))[:, None, None, :]
        keep = real.unsqueeze(-1).to(x.dtype)
        for block in self.blocks:
            x = block(x, keep, attn_mask)
        return x


class RefineTextInput:
    """Forward pre-hook of ``condition_embedder.text_embedder``: its input goes through the refiner.
    A plain object holding the refiner, so a deep copy of the model (EMA, export) calls the copy's."""

    def __init__(self, refiner: TextRefiner):
        self.refiner = refiner

    def __call__(self, module, args):
        return (self.refiner(args[0]), *args[1:])


def attach_text_refiner(model, options: dict) -> TextRefiner:
    """Build ``model.text_refiner`` (zero-init) and hook it in front of the text projection."""
    refiner = TextRefiner(model.config.text_dim, **options)
    model.text_refiner = refiner
    model.condition_embedder.text_embedder.register_forward_pre_hook(RefineTextInput(refiner))
    return refiner


def text_refiner_of(model) -> TextRefiner | None:
    model = getattr(model, "_orig_mod", model)
    return getattr(model, "text_refiner", None)


def add_text_refiner(model, layers: int = 1, heads: int | None = None, mlp_ratio: float = 2.0):
    """Give a loaded Wan transformer (``WanTransformer3DModel`` or ``MHLAWanTransformer3DModel``, or a
    pipeline's ``.transformer``) a fresh ``TextRefiner`` in place and return the model.

    The refiner starts as the identity (zero-initialised output projections), so the model's output is
    unchanged until it trains. A plain Wan model becomes an ``MHLAWanTransformer3DModel`` (as
    ``mediagen.convert`` does; its attention is untouched); the config records
    ``mediagen_text_refiner = {"layers", "heads", "mlp_ratio"}``. ``heads`` defaults to text_dim // 64
    (at least 1)."""
    from diffusers import WanTransformer3DModel

    from .converted import MHLAWanTransformer3DModel

    if hasattr(model, "components") and hasattr(model, "register_modules"):  # a DiffusionPipeline
        add_text_refiner(model.transformer, layers, heads, mlp_ratio)
        model.register_modules(transformer=model.transformer)
        return model
    target = getattr(model, "_orig_mod", model)
    if not isinstance(target, WanTransformer3DModel):
        raise ValueError(f"add_text_refiner() takes a Wan transformer (WanTransformer3DModel / "
                         f"MHLAWanTransformer3DModel); got {type(target).__name__}")
    if text_refiner_of(target) is not None or target.config.get(CONFIG_KEY) is not None:
        raise ValueError(f"the model already has a text refiner ({target.config.get(CONFIG_KEY)}): "
                         f"add_text_refiner() adds one only to a model without")
    options = refiner_options(target.config.text_dim, layers, heads, mlp_ratio)
    param = next(target.parameters())
    target.__class__ = MHLAWanTransformer3DModel
    attach_text_refiner(target, options).to(device=param.device, dtype=param.dtype)
    target.register_to_config(**{CONFIG_KEY: options})
    return model

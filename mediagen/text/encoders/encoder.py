"""A MiniLM-shaped text encoder whose self-attention is ``sdpa``, ``mlra2``, ``mlra4`` or ``hla``.

Causal (decoder-only, as SANA conditions on a decoder LM) rather than bidirectional, because:
  * HLA is Gated DeltaNet, a causal recurrence; a bidirectional HLA would be a different method;
  * MLRA's point is the latent-only KV cache and absorbed decoding, which exist for causal attention;
  * with right padding, padded tokens come after every real token, so they cannot change any real
    token's output by construction (no mask arithmetic to get wrong, and flash kernels stay usable);
  * all four paths then compute the same kind of function, so their latency and quality compare.
The cost: an early token does not see later words, so no causal encoder can give MiniLM's (bidirectional)
state where that state depends on later words ("moves" in "the digit 3 moves left" carries "left"). A
video model trained on MiniLM's states then misreads the digit. ``echo=True`` reads each prompt twice,
as echo embeddings do for decoder LMs: the encoder runs on ``[real tokens] [real tokens] [padding]``, the
second copy at the same positions as the first, and returns the second copy's states, each of which has
seen the whole prompt. The attention stays causal (and right padding stays behind every real token);
the cost is twice the tokens.

Architecture (so MiniLM's weights map onto it): token embedding + one token-type vector + learned
absolute positions (``max_position_embeddings``; positions beyond it reuse the last one, while MLRA's
RoPE and HLA's recurrence keep ordering tokens), LayerNorm, then post-LayerNorm blocks
x = LN(x + attn(x)); x = LN(x + FFN(x)) with a GELU FFN. Outputs at padded positions are zero.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from torch import nn

from ..attention import HLAttention, MLRAttention, MultiHeadSelfAttention
from .output import TextEncoderOutput

ATTENTIONS = ("sdpa", "mlra2", "mlra4", "hla")


class EncoderBlock(nn.Module):
    def __init__(self, attn: nn.Module, hidden: int, intermediate: int, eps: float):
        super().__init__()
        self.attn = attn
        self.attn_norm = nn.LayerNorm(hidden, eps=eps)
        self.ffn_in = nn.Linear(hidden, intermediate)
        self.ffn_out = nn.Linear(intermediate, hidden)
        self.ffn_norm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x, attention_mask):
        x = self.attn_norm(x + self.attn(x, attention_mask=attention_mask))
        return self.ffn_norm(x + self.ffn_out(F.gelu(self.ffn_in(x))))


class MediagenTextEncoder(ModelMixin, ConfigMixin):
    """Causal text encoder; ``attention`` picks the token mixer. Round-trips with
    ``save_pretrained`` / ``from_pretrained`` (safetensors)."""

    config_name = "config.json"

    @register_to_config
    def __init__(self, attention: str = "sdpa", vocab_size: int = 30522, hidden_size: int = 384,
                 num_layers: int = 6, num_heads: int = 12, intermediate_size: int = 1536,
                 max_position_embeddings: int = 512, layer_norm_eps: float = 1e-12, pad_token_id: int = 0,
                 attention_bias: bool = True, mlra_kv_latent: int | None = None,
                 mlra_q_latent: int | None = None, mlra_rope_dim: int | None = None,
                 hla_chunk: int = 256, hla_pool: int = 16, hla_gate_bias: float = 2.2,
                 hla_top_k: int | None = None, hla_gate_threshold: float | None = None,
                 hla_route: str = "token", hla_backend: str = "auto", echo: bool = False):
        super().__init__()
        if attention not in ATTENTIONS:
            raise ValueError(f"attention={attention!r} is not allowed: choose one of {ATTENTIONS}")
        self.word_embeddings = nn.Embedding(vocab_size, hidden_size, padding_idx=pad_token_id)
        self.type_embedding = nn.Parameter(torch.zeros(hidden_size))
        self.position_embeddings = (nn.Embedding(max_position_embeddings, hidden_size)
                                    if max_position_embeddings > 0 else None)
        self.embed_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.layers = nn.ModuleList(
            EncoderBlock(self._make_attention(), hidden_size, intermediate_size, layer_norm_eps)
            for _ in range(num_layers))
        for module in self.modules():                                  # BERT-like init for the rest
            if isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)

    def _make_attention(self) -> nn.Module:
        c = self.config
        if c.attention == "sdpa":
            return MultiHeadSelfAttention(c.hidden_size, c.num_heads, causal=True, bias=c.attention_bias)
        if c.attention in ("mlra2", "mlra4"):
            return MLRAttention(c.hidden_size, c.num_heads, branches=int(c.attention[-1]),
                                kv_latent=c.mlra_kv_latent, q_latent=c.mlra_q_latent,
                                rope_dim=c.mlra_rope_dim, causal=True, bias=c.attention_bias)
        return HLAttention(c.hidden_size, c.num_heads, chunk=c.hla_chunk, pool=c.hla_pool,
                           gate_bias=c.hla_gate_bias, top_k=c.hla_top_k,
                           gate_threshold=c.hla_gate_threshold, route=c.hla_route, backend=c.hla_backend,
                           bias=c.attention_bias)

    def embed(self, input_ids, positions=None):
        x = self.word_embeddings(input_ids) + self.type_embedding
        if self.position_embeddings is not None:
            if positions is None:
                positions = torch.arange(input_ids.shape[1], device=input_ids.device)
            x = x + self.position_embeddings(positions.clamp_max(self.position_embeddings.num_embeddings - 1))
        return self.embed_norm(x)

    def _echo(self, input_ids, attention_mask):
        """(ids, mask, positions) of ``[real] [real] [padding]`` per row (B, 2L), and the index (B, L) of
        each token's second copy in it; mask None when every row is whole (the layers then skip masking)."""
        B, L = input_ids.shape
        lengths = attention_mask.sum(1, keepdim=True) if attention_mask is not None else torch.full(
            (B, 1), L, device=input_ids.device)
        j = torch.arange(2 * L, device=input_ids.device).expand(B, -1)
        positions = torch.where(j < lengths, j, j - lengths)
        real = j < 2 * lengths
        ids = torch.where(real, input_ids.gather(1, positions.clamp(0, L - 1)), self.config.pad_token_id)
        second = (lengths + torch.arange(L, device=input_ids.device)).clamp_max(2 * L - 1)
        return ids, None if attention_mask is None else real.to(torch.long), positions, second

    def forward(self, input_ids, attention_mask=None, return_aux: bool | None = None, return_dict: bool = True):
        """input_ids (B, L), attention_mask (B, L) (1 = real, right padding). Returns ``TextEncoderOutput``."""
        ids, mask, positions, second = input_ids, attention_mask, None, None
        if self.config.echo:
            ids, mask, positions, second = self._echo(input_ids, attention_mask)
        x = self.embed(ids, positions)
        aux = x.new_zeros(())
        for layer in self.layers:  # no mask given: every token is real, and the layers skip masking
            x = layer(x, mask)
            if isinstance(layer.attn, HLAttention) and (return_aux or (return_aux is None and self.training)):
                aux = aux + layer.attn.aux_losses.get("total", 0.0)
        if second is not None:
            x = x.gather(1, second[..., None].expand(-1, -1, x.shape[-1]))
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        else:
            x = x * attention_mask[..., None].to(x.dtype)
        out = TextEncoderOutput(last_hidden_state=x, attention_mask=attention_mask, aux_loss=aux)
        return out if return_dict else out.to_tuple()

    def set_hla_skipping(self, top_k: int | None = None, gate_threshold: float | None = None,
                         route: str | None = None):
        """Switch HLA's chunk skipping (beyond the paper) on every layer; also recorded in the config.
        ``route``: "token" (rank by mean per-token gate) or "chunk" (cheap chunk-level ranking)."""
        route = route or self.config.hla_route
        if route not in ("token", "chunk"):
            raise ValueError(f"route={route!r} is not allowed: use 'token' or 'chunk'")
        for layer in self.layers:
            if isinstance(layer.attn, HLAttention):
                layer.attn.top_k, layer.attn.gate_threshold, layer.attn.route = top_k, gate_threshold, route
        self.register_to_config(hla_top_k=top_k, hla_gate_threshold=gate_threshold, hla_route=route)

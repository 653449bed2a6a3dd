"""A tiny self-contained text encoder: UTF-8 bytes -> a few transformer layers -> ``last_hidden_state``.

It is the default text conditioning of the small pipelines (no tokenizer files, no download). It
tokenises for itself: ``encode_text(prompts)`` returns (hidden states, attention mask), the hook
the pipelines call when an encoder has it. Token ids are byte + 1; 0 is padding.
"""

from __future__ import annotations

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from torch import nn
from transformers.modeling_outputs import BaseModelOutput

VOCAB = 257  # 256 byte values + padding


class ByteTextEncoder(ModelMixin, ConfigMixin):
    @register_to_config
    def __init__(self, hidden_size: int = 384, num_layers: int = 2, num_heads: int = 4, max_length: int = 64):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, hidden_size, padding_idx=0)
        self.pos = nn.Parameter(torch.randn(max_length, hidden_size) * 0.02)
        layer = nn.TransformerEncoderLayer(hidden_size, num_heads, 4 * hidden_size, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.layers = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(hidden_size)

    def tokenize(self, prompts: list[str], max_length: int | None = None):
        """(input_ids, attention_mask), both (B, max_length) int64; prompts are cut at max_length bytes."""
        n = min(max_length or self.config.max_length, self.config.max_length)
        ids = torch.zeros(len(prompts), n, dtype=torch.long)
        for i, p in enumerate(prompts):
            b = list(p.encode("utf-8"))[:n]
            ids[i, : len(b)] = torch.tensor(b, dtype=torch.long) + 1
        return ids, (ids > 0).long()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, return_dict: bool = True):
        if attention_mask is None:
            attention_mask = (input_ids > 0).long()
        x = self.embed(input_ids) + self.pos[: input_ids.shape[1]]
        # an all-padding row (empty prompt) would give NaNs under a full key mask: keep token 0 visible
        pad = attention_mask == 0
        pad[:, 0] = False
        x = self.norm(self.layers(x, src_key_padding_mask=pad))
        return BaseModelOutput(last_hidden_state=x) if return_dict else (x,)

    def encode_text(self, prompts: list[str], max_length: int | None = None):
        """The pipelines' hook: (last_hidden_state (B, L, hidden), attention_mask (B, L))."""
        ids, mask = self.tokenize(prompts, max_length)
        ids, mask = ids.to(self.device), mask.to(self.device)
        return self(ids, mask).last_hidden_state, mask

"""Distillation toward what a video transformer reads: ``CrossAttentionReader`` computes exactly the
cross-attention keys and values the transformer computes from the text states, ``reader_error`` ignores
padding, and distilling with a reader lowers that error."""

import pytest
import torch

from mediagen.text.encoders import (CrossAttentionReader, DistillConfig, MediagenTextEncoder, distill,
                                    load_minilm_tokenizer, read_similarity, reader_error)
from tests.models_fixtures import tiny_wan, wan_inputs

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = dict(vocab_size=30522, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64)


def test_reads_are_the_keys_and_values_the_transformer_computes():
    model = tiny_wan(num_layers=2)
    inputs = wan_inputs()
    seen = {}
    hooks = [m.register_forward_hook(lambda _m, _i, out, key=(i, kind): seen.setdefault(key, out))
             for i, block in enumerate(model.blocks)
             for kind, m in (("k", block.attn2.norm_k), ("v", block.attn2.to_v))]
    with torch.no_grad():
        model(**inputs)
    for h in hooks:
        h.remove()
    with torch.no_grad():
        reads = CrossAttentionReader([model])(inputs["encoder_hidden_states"])
    want = [seen[(i, kind)] for i in range(len(model.blocks)) for kind in "kv"]
    assert len(reads) == len(want) == 4
    for got, ref in zip(reads, want):
        torch.testing.assert_close(got, ref, rtol=0, atol=0)


def test_reader_error_is_zero_for_the_same_states_and_ignores_padding():
    reader = CrossAttentionReader([tiny_wan(num_layers=2)])
    g = torch.Generator().manual_seed(3)
    states = torch.randn(2, 6, 32, generator=g)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    teacher = reader(states * mask[..., None])
    assert reader_error(reader, states, teacher, mask).item() == 0.0
    padded = states.clone()
    padded[0, 4:] += 5.0                                               # only padded positions change
    assert reader_error(reader, padded, teacher, mask).item() == 0.0
    moved = states.clone()
    moved[0, 1] += 0.5                                                 # a real token changes
    assert reader_error(reader, moved, teacher, mask).item() > 1e-4


def test_distilling_with_a_reader_lowers_the_reader_error():
    tok = load_minilm_tokenizer()
    torch.manual_seed(0)
    teacher = MediagenTextEncoder(attention="sdpa", **TINY).eval()
    torch.manual_seed(1)
    student = MediagenTextEncoder(attention="mlra2", **TINY).eval()
    reader = CrossAttentionReader([tiny_wan(num_layers=2)])
    prompts = [f"the digit {d} moves {m}" for d in range(10) for m in ("left", "right", "up", "down")]

    class Teacher(torch.nn.Module):                                    # MiniLM's keyword call
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids, attention_mask)

    before = read_similarity(student, Teacher(teacher), tok, prompts, reader)
    history = distill(student, Teacher(teacher), tok, DistillConfig(steps=30, batch_size=8, lr=3e-3, log_every=1),
                      prompts=prompts, progress=False, reader=reader)
    after = read_similarity(student, Teacher(teacher), tok, prompts, reader)
    assert all("reader_error" in h for h in history)
    assert after > before + 0.05, (before, after)
    with pytest.raises(ValueError, match="reader_weight=-1"):
        distill(student, Teacher(teacher), tok, DistillConfig(steps=1, reader_weight=-1), prompts=prompts,
                progress=False, reader=reader)

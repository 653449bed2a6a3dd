"""Shipped pipeline folders: fp16 transformer, text encoder replaced by a reference, same outputs."""

import json

import numpy as np
import pytest
import torch

from mediagen.models.presets import build_transformer
from mediagen.pipelines import build_pipeline
from mediagen.pipelines.building import pipeline_around
from mediagen.pipelines.schedulers import make_scheduler
from mediagen.pipelines.shipping import TEXT_ENCODER_REF, save_shipped_pipeline
from mediagen.pipelines.text_video import TextToVideoPipeline
from mediagen.text.encoders import load_text_encoder


def test_shipped_video_pipeline_references_minilm_and_generates_the_same(tmp_path):
    torch.manual_seed(0)
    transformer = build_transformer("wan-tiny", text_dim=384).eval()
    encoder = load_text_encoder("minilm")
    base = pipeline_around(transformer, make_scheduler("flow-euler", 3.0))
    pipe = TextToVideoPipeline(transformer=transformer, scheduler=base.scheduler, vae=base.vae,
                               text_encoder=encoder.model, tokenizer=encoder.tokenizer)
    pipe.save_pretrained(str(tmp_path / "full"), safe_serialization=True)
    shipped = save_shipped_pipeline(tmp_path / "full", tmp_path / "shipped", text_encoder="minilm")
    assert not (shipped / "text_encoder").exists() and not (shipped / "tokenizer").exists()
    assert json.loads((shipped / TEXT_ENCODER_REF).read_text()) == {"name": "minilm"}
    from safetensors.torch import load_file
    weights = load_file(str(next((shipped / "transformer").glob("*.safetensors"))))
    assert {v.dtype for v in weights.values()} == {torch.float16}
    a, b = build_pipeline(str(tmp_path / "full")), build_pipeline(str(shipped))
    assert type(b.text_encoder).__name__ == "BertModel"
    kw = dict(prompt=["the digit 3 moves left", ""], height=8, width=8, num_frames=3, num_inference_steps=2,
              output_type="np")
    x = np.asarray(a(generator=torch.Generator().manual_seed(1), **kw).frames)
    y = np.asarray(b(generator=torch.Generator().manual_seed(1), **kw).frames)
    assert x.shape == y.shape and np.abs(x - y).max() < 5e-3      # fp16 weights, fp32 compute


def test_bad_sources_and_references_are_named(tmp_path):
    with pytest.raises(ValueError, match="not a pipeline folder"):
        save_shipped_pipeline(tmp_path, tmp_path / "out")
    pipe = pipeline_around(build_transformer("dit-tiny"), make_scheduler("flow-euler", 1.0))
    pipe.save_pretrained(str(tmp_path / "dit"), safe_serialization=True)
    (tmp_path / "dit" / TEXT_ENCODER_REF).write_text("{}")
    from mediagen.pipelines.shipping import referenced_text_encoder
    with pytest.raises(ValueError, match="must hold"):
        referenced_text_encoder(tmp_path / "dit")


def test_a_folder_naming_a_distilled_encoder_loads_and_encodes_through_it(tmp_path):
    """model_index.json names MiniLM's class; a reference to a distilled encoder (another class) still
    loads, and the pipeline's prompt states are that encoder's."""
    torch.manual_seed(0)
    transformer = build_transformer("wan-tiny", text_dim=384).eval()
    encoder = load_text_encoder("minilm")
    base = pipeline_around(transformer, make_scheduler("flow-euler", 3.0))
    TextToVideoPipeline(transformer=transformer, scheduler=base.scheduler, vae=base.vae, text_encoder=encoder.model,
                        tokenizer=encoder.tokenizer).save_pretrained(str(tmp_path / "full"), safe_serialization=True)
    shipped = save_shipped_pipeline(tmp_path / "full", tmp_path / "shipped", text_encoder="minilm-mlra2-distilled")
    pipe = build_pipeline(str(shipped))
    assert type(pipe.text_encoder).__name__ == "MediagenTextEncoder"
    prompt = "the digit 3 moves left"
    got, _ = pipe.encode_prompt(prompt, do_classifier_free_guidance=False, max_sequence_length=16, device="cpu",
                                dtype=torch.float32)
    want, mask = load_text_encoder("minilm-mlra2-distilled").encode([prompt], max_length=16, padding="max_length")
    torch.testing.assert_close(got, want * mask[..., None])
    minilm, _ = encoder.encode([prompt], max_length=16, padding="max_length")
    assert (got - minilm).abs().max() > 1e-2                    # not MiniLM's states
    frames = np.asarray(pipe(prompt=prompt, height=8, width=8, num_frames=3, num_inference_steps=2,
                             output_type="np", generator=torch.Generator().manual_seed(1)).frames)
    assert frames.shape[:2] == (1, 3) and np.isfinite(frames).all()

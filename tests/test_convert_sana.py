"""mediagen.convert on a tiny random SANA transformer (diffusers' SanaTransformer2DModel)."""

import torch
from models_fixtures import capture_attn1, sana_inputs, sana_qkv, tiny_sana

import mediagen
from mediagen.kernels import mhla_reference
from mediagen.models import MHLASanaTransformer2DModel, load_transformer


def run(model, inputs):
    with torch.no_grad():
        return model(**inputs, return_dict=False)[0]


def test_linear_conversion_reproduces_sanas_own_attention():
    """SANA's self-attention is ReLU linear attention: "linear" with eps=1e-15 is the same computation."""
    model, inputs = tiny_sana(), sana_inputs()
    before = run(model, inputs)
    mediagen.convert(model, "linear", eps=1e-15)
    assert isinstance(model, MHLASanaTransformer2DModel)
    torch.testing.assert_close(run(model, inputs), before, rtol=1e-4, atol=1e-5)


def test_sana_mhla_layers_equal_reference_on_their_qkv():
    model = mediagen.convert(tiny_sana(), "mhla", blocks=[2, 3])
    with torch.no_grad():  # a non-uniform Mc, so a wrong block layout would show
        for block in model.transformer_blocks:
            block.attn1.processor.core.mix.uniform_(0, 1)
    inputs = sana_inputs(height=6, width=10)
    records, handles = capture_attn1(model, "transformer_blocks")
    out = run(model, inputs)
    for h in handles:
        h.remove()
    assert len(records) == 2 and out.shape == inputs["hidden_states"].shape
    for attn, x, got, _ in records:
        q, k, v = sana_qkv(attn, x)
        o = mhla_reference(q, k, v, attn.processor.core.mix, (6, 10), (2, 3), feature_map="relu")
        torch.testing.assert_close(got, attn.to_out[0](o.flatten(2)), rtol=1e-5, atol=1e-5)
    assert all(b.attn2.processor.__class__.__name__ == "SanaAttnProcessor2_0" for b in model.transformer_blocks)


def test_sana_round_trip_and_default_blocks(tmp_path):
    model = mediagen.convert(tiny_sana(), ["mhla", "sdpa"])        # blocks from sample_size 8: 8x8 tokens
    assert model.config.mediagen_attention["blocks"] == [2, 2]
    with torch.no_grad():
        model.transformer_blocks[0].attn1.processor.core.mix.uniform_(0, 1)
    inputs = sana_inputs()
    want = run(model, inputs)
    model.save_pretrained(tmp_path / "sana")
    back = load_transformer(tmp_path / "sana")
    assert type(back).__name__ == "MHLASanaTransformer2DModel"
    assert torch.equal(run(back.eval(), inputs), want)
    assert type(back.transformer_blocks[1].attn1.processor).__name__ == "AttnProcessor2_0"  # softmax layer


def _tiny_dc_autoencoder():
    from diffusers import AutoencoderDC

    torch.manual_seed(2)
    return AutoencoderDC(in_channels=3, latent_channels=4, attention_head_dim=4,
                         encoder_block_types=("ResBlock", "ResBlock"), decoder_block_types=("ResBlock", "ResBlock"),
                         encoder_block_out_channels=(8, 8), decoder_block_out_channels=(8, 8),
                         encoder_layers_per_block=(1, 1), decoder_layers_per_block=(1, 1),
                         encoder_qkv_multiscales=((), ()), decoder_qkv_multiscales=((), ()),
                         upsample_block_type="interpolate", downsample_block_type="Conv",
                         decoder_norm_types="rms_norm", decoder_act_fns="silu", scaling_factor=0.41)


def test_diffusers_sana_pipeline_runs_the_converted_model(tmp_path):
    """diffusers' own SanaPipeline, converted through the pipeline, saved and loaded back (prompt
    embeddings given directly: the tiny setup has no Gemma tokenizer)."""
    from diffusers import DiffusionPipeline, FlowMatchEulerDiscreteScheduler, SanaPipeline

    pipe = SanaPipeline(tokenizer=None, text_encoder=None, vae=_tiny_dc_autoencoder(), transformer=tiny_sana(),
                        scheduler=FlowMatchEulerDiscreteScheduler())
    mediagen.convert(pipe, "mhla", blocks=[2, 2])
    emb, mask = torch.randn(1, 5, 24), torch.ones(1, 5, dtype=torch.long)
    call = dict(negative_prompt=None, prompt_embeds=emb, prompt_attention_mask=mask,
                negative_prompt_embeds=torch.zeros(1, 5, 24), negative_prompt_attention_mask=mask, height=32,
                width=32, num_inference_steps=2, output_type="pt", use_resolution_binning=False)
    images = pipe(**call, generator=torch.Generator().manual_seed(0)).images
    assert images.shape == (1, 3, 32, 32) and torch.isfinite(images).all()
    pipe.save_pretrained(tmp_path / "pipe")
    back = DiffusionPipeline.from_pretrained(tmp_path / "pipe", tokenizer=None, text_encoder=None)
    assert type(back.transformer).__name__ == "MHLASanaTransformer2DModel"
    assert torch.equal(back(**call, generator=torch.Generator().manual_seed(0)).images, images)

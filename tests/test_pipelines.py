"""Pipelines on tiny random models: shapes and dtypes, seeds, every scheduler, the transformer's calls, outputs
that agree across output types, callbacks, errors. What the loop computes is checked on stand-in models with
closed-form samples in test_pipelines_sampling.py."""

import numpy as np
import pytest
import torch
from models_fixtures import tiny_dit, tiny_wan

import mediagen
from mediagen.models import ByteTextEncoder, IdentityAutoencoder
from mediagen.pipelines import (SCHEDULERS, ClassConditionalImagePipeline, TextToImagePipeline, TextToVideoPipeline,
                                make_scheduler)


def quiet(pipe):
    pipe.set_progress_bar_config(disable=True)
    return pipe


def dit_pipe(scheduler="flow-euler", attention="mhla"):
    model = tiny_dit(num_layers=2)
    if attention:
        mediagen.convert(model, attention)
    return quiet(ClassConditionalImagePipeline(model, make_scheduler(scheduler), IdentityAutoencoder(latent_channels=1)))


def wan_pipe(cls=TextToVideoPipeline, scheduler="flow-unipc", vae=None, encoder=True):
    model = mediagen.convert(tiny_wan(num_layers=2), "wan-mhla-h", grid=(3, 4, 4))
    torch.manual_seed(0)
    text_encoder = ByteTextEncoder(hidden_size=32, num_layers=1, num_heads=2, max_length=16).eval() if encoder else None
    vae = vae or IdentityAutoencoder(latent_channels=1)
    return quiet(cls(model, make_scheduler(scheduler), vae, text_encoder=text_encoder))


def gen(seed):
    return torch.Generator().manual_seed(seed)


def record_timesteps(model):
    """Every call's timestep tensor, recorded by a forward pre-hook on the transformer."""
    seen = []

    def hook(module, args, kwargs):
        seen.append(kwargs["timestep"].detach().clone())

    model.register_forward_pre_hook(hook, with_kwargs=True)
    return seen


def assert_one_call_per_step(seen, steps, batch):
    """One call per step, each at one timestep for the whole batch, from the noisy end down."""
    assert len(seen) == steps, [t.tolist() for t in seen]
    assert all(t.shape == (batch,) and bool((t == t[0]).all()) for t in seen), [t.tolist() for t in seen]
    firsts = [float(t[0]) for t in seen]
    assert all(a > b for a, b in zip(firsts, firsts[1:])), f"timesteps not strictly decreasing: {firsts}"


def from_latents(latents):
    """What the identity autoencoder's pixels become as np images in [0, 1]: (x / 2 + 0.5) clamped."""
    return (latents / 2 + 0.5).clamp(0, 1)


VIDEO = dict(height=8, width=8, num_frames=3, num_inference_steps=2)


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_class_image_every_scheduler(scheduler):
    pipe = dit_pipe(scheduler)
    seen = record_timesteps(pipe.transformer)
    a = pipe([1, 7], num_inference_steps=2, output_type="np", generator=gen(0)).images
    assert_one_call_per_step(seen, 2, batch=4)                    # guidance 4 (the default): the batch doubled
    b = pipe([1, 7], num_inference_steps=2, output_type="np", generator=gen(0)).images
    assert a.shape == (2, 8, 8, 1) and a.dtype == np.float32 and np.isfinite(a).all()
    assert 0 <= a.min() and a.max() <= 1
    assert np.array_equal(a, b)
    if scheduler == "ddim":
        c = pipe([1, 7], num_inference_steps=2, output_type="np", generator=gen(1)).images
        assert not np.array_equal(a, c)


def test_class_image_output_types():
    pipe = dit_pipe()
    pt = pipe([3], num_inference_steps=2, output_type="pt", generator=gen(0)).images
    assert pt.shape == (1, 1, 8, 8) and pt.dtype == torch.float32
    pil = pipe([3, 4], num_inference_steps=2, output_type="pil", generator=gen(0)).images
    assert len(pil) == 2 and pil[0].size == (8, 8)
    lat = pipe(3, num_inference_steps=2, output_type="latent", generator=gen(0)).images
    assert lat.shape == (1, 1, 8, 8)
    # one sample, three forms: the latents decoded by the identity autoencoder, as a tensor and as an array
    one = pipe([3], num_inference_steps=2, output_type="np", generator=gen(0)).images
    torch.testing.assert_close(pt, from_latents(lat))
    np.testing.assert_allclose(one[0, ..., 0], pt[0, 0].numpy(), rtol=1e-6, atol=1e-6)
    bigger = pipe([3], num_inference_steps=2, height=12, width=12, output_type="np", generator=gen(0)).images
    assert bigger.shape == (1, 12, 12, 1)  # another resolution: the grid follows


def test_class_labels_take_integers_of_any_integer_type():
    """Class indices as numpy or torch integers (a label array, a tensor, one numpy int), as diffusers' DiTPipeline
    takes them, give the samples of the same ints; they were refused as out of range ("class_labels contains
    np.int64(3): class indices run from 0 to 9") or failed with a TypeError. Floats and bools stay refused."""
    pipe = dit_pipe()
    want = pipe([3, 7], num_inference_steps=1, output_type="np", generator=gen(0)).images
    for labels in (np.array([3, 7]), torch.tensor([3, 7]), [np.int64(3), torch.tensor(7)]):
        assert np.array_equal(pipe(labels, num_inference_steps=1, output_type="np", generator=gen(0)).images, want)
    one = pipe(3, num_inference_steps=1, output_type="np", generator=gen(0)).images
    for label in (np.int64(3), torch.tensor(3)):
        assert np.array_equal(pipe(label, num_inference_steps=1, output_type="np", generator=gen(0)).images, one)
    for bad, shown in ((3.0, "3.0"), ([True], "True"), (torch.tensor([1.5]), "1.5"), (torch.tensor(1.5), "1.5"),
                       ("3", "'3'")):
        with pytest.raises(ValueError, match=rf"class_labels .*{shown}.*class indices"):
            pipe(bad, num_inference_steps=1)


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_text_to_video_every_scheduler(scheduler):
    pipe = wan_pipe(scheduler=scheduler)
    seen = record_timesteps(pipe.transformer)
    a = pipe("a moving digit", generator=gen(0), **VIDEO).frames
    assert_one_call_per_step(seen, VIDEO["num_inference_steps"], batch=2)   # guidance 5: negative and positive
    b = pipe("a moving digit", generator=gen(0), **VIDEO).frames
    assert a.shape == (1, 3, 8, 8, 1) and a.dtype == np.float32 and np.isfinite(a).all()
    assert np.array_equal(a, b)


def test_text_to_video_batches_embeds_and_callbacks():
    pipe = wan_pipe()
    seen = []

    def on_step_end(p, i, t, tensors):
        seen.append((i, tuple(tensors["latents"].shape), tuple(tensors["prompt_embeds"].shape)))
        return {"latents": tensors["latents"] * 0}

    out = pipe(["one", "two"], num_videos_per_prompt=2, generator=gen(0), output_type="pt",
               callback_on_step_end=on_step_end, callback_on_step_end_tensor_inputs=["latents", "prompt_embeds"],
               **VIDEO).frames
    assert out.shape == (4, 3, 1, 8, 8)
    assert [s[0] for s in seen] == [0, 1] and seen[0][1] == (4, 1, 3, 8, 8) and seen[0][2][0] == 4
    assert torch.allclose(out, torch.full_like(out, 0.5))  # zeroed latents decode to mid-grey

    # prompt_embeds from any encoder, no text encoder in the pipeline
    bare = wan_pipe(encoder=False)
    embeds = torch.randn(1, 7, 32)
    v1 = bare(prompt_embeds=embeds, generator=gen(0), **VIDEO).frames
    v2 = bare(prompt_embeds=embeds, negative_prompt_embeds=torch.zeros(1, 3, 32), generator=gen(0), **VIDEO).frames
    assert v1.shape == (1, 3, 8, 8, 1) and np.array_equal(v1, v2)
    with pytest.raises(ValueError, match="text_encoder"):
        bare("a prompt", **VIDEO)


def test_hugging_face_style_encoder_plugs_in():
    """An encoder with a tokenizer and a ``last_hidden_state`` output (the issue-4 encoders' interface)."""

    class Tokenizer:
        def __call__(self, prompts, padding, max_length, truncation, add_special_tokens, return_tensors):
            ids = torch.tensor([[len(p) % 5 + 1] * 4 + [0] * (max_length - 4) for p in prompts])
            return {"input_ids": ids, "attention_mask": (ids > 0).long()}

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(8, 32)

        @property
        def device(self):  # what diffusers asks of a component (ModelMixin / PreTrainedModel have it)
            return self.embed.weight.device

        @property
        def dtype(self):
            return self.embed.weight.dtype

        def forward(self, input_ids, attention_mask):
            from transformers.modeling_outputs import BaseModelOutput
            return BaseModelOutput(last_hidden_state=self.embed(input_ids))

    bare = wan_pipe(encoder=False)
    pipe = quiet(TextToVideoPipeline(bare.transformer, bare.scheduler, bare.vae, text_encoder=Encoder(),
                                     tokenizer=Tokenizer()))
    embeds, neg = pipe.encode_prompt(["abc", "de"], do_classifier_free_guidance=True, max_sequence_length=6)
    assert embeds.shape == (2, 6, 32) and neg.shape == (2, 6, 32)
    assert torch.equal(embeds[:, 4:], torch.zeros(2, 2, 32))  # padding zeroed
    assert pipe("abc", generator=gen(0), max_sequence_length=6, **VIDEO).frames.shape == (1, 3, 8, 8, 1)


def test_text_to_image():
    pipe = wan_pipe(cls=TextToImagePipeline)
    images = pipe(["a seven", "a one"], height=8, width=12, num_inference_steps=2, output_type="np",
                  generator=gen(0)).images
    assert images.shape == (2, 8, 12, 1)
    pil = pipe("a seven", height=8, width=8, num_inference_steps=2, generator=gen(0)).images
    assert len(pil) == 1 and pil[0].size == (8, 8)
    latent = pipe(["a seven", "a one"], height=8, width=12, num_inference_steps=2, output_type="latent",
                  generator=gen(0)).images
    np.testing.assert_allclose(images, from_latents(latent[:, :, 0]).permute(0, 2, 3, 1).numpy(), rtol=1e-6,
                               atol=1e-6)
    seen = record_timesteps(pipe.transformer)
    pipe("a seven", height=8, width=8, num_inference_steps=3, guidance_scale=1.0, output_type="latent",
         generator=gen(0))
    assert_one_call_per_step(seen, 3, batch=1)                      # no guidance: one pass, the batch as given


def test_text_to_image_from_a_clip_is_its_middle_frame():
    pipe = wan_pipe(cls=TextToImagePipeline)
    video = TextToVideoPipeline(**pipe.components)
    clip = video("a seven", **dict(VIDEO, num_frames=4), output_type="np", generator=gen(3)).frames
    still = pipe("a seven", height=8, width=8, num_frames=4, num_inference_steps=2, output_type="np",
                 generator=gen(3)).images
    assert np.array_equal(still[0], clip[0, 2]) and not np.array_equal(still[0], clip[0, 0])
    latent = pipe("a seven", height=8, width=8, num_frames=4, num_inference_steps=2, output_type="latent",
                  generator=gen(3)).images
    assert latent.shape == (1, 1, 1, 8, 8)
    with pytest.raises(ValueError, match="num_frames=4 is not allowed with 4-D latents"):
        pipe("a seven", height=8, width=8, num_frames=4, latents=torch.zeros(1, 1, 8, 8))


def test_pipeline_save_load_same_output(tmp_path):
    pipe = wan_pipe()
    before = pipe("a digit", generator=gen(3), **VIDEO).frames
    pipe.save_pretrained(tmp_path)
    loaded = quiet(TextToVideoPipeline.from_pretrained(tmp_path))
    assert type(loaded.transformer).__name__ == "MHLAWanTransformer3DModel"
    assert np.array_equal(loaded("a digit", generator=gen(3), **VIDEO).frames, before)


def test_bad_pipeline_input_names_the_parameter():
    pipe = wan_pipe()
    with pytest.raises(ValueError, match=r"height=9 .*multiple of 2 \(autoencoder factor 1 x patch 2\)"):
        pipe("x", height=9, width=8, num_frames=3)
    scaled = wan_pipe(vae=IdentityAutoencoder(latent_channels=1, scale_factor_spatial=4, scale_factor_temporal=4))
    with pytest.raises(ValueError, match=r"width=12 .*multiple of 8 \(autoencoder factor 4 x patch 2\)"):
        scaled("x", height=16, width=12, num_frames=5)
    with pytest.raises(ValueError, match=r"num_frames=4 .*4k \+ 1"):
        scaled("x", height=16, width=16, num_frames=4)
    with pytest.raises(ValueError, match="output_type='gif'"):
        pipe("x", output_type="gif", **VIDEO)
    dit = dit_pipe()
    with pytest.raises(ValueError, match="class_labels contains 10: class indices run from 0 to 9"):
        dit([10])
    with pytest.raises(ValueError, match="height=7"):
        dit([1], height=7, width=7)
    with pytest.raises(ValueError, match="scheduler='euler'"):
        make_scheduler("euler")


@pytest.mark.parametrize("kind", ["class-image", "text-video"])
def test_given_latents_are_scaled_like_the_pipelines_own_noise(kind):
    """latents= takes unit noise, as diffusers' pipelines do: both pipelines scale it by the scheduler's
    init_noise_sigma exactly as they scale the noise they draw, so passing the noise a seed would draw gives
    that seed's sample (under a scheduler whose init_noise_sigma is not 1 as well)."""
    from diffusers.utils.torch_utils import randn_tensor

    pipe = dit_pipe() if kind == "class-image" else wan_pipe()
    pipe.scheduler.init_noise_sigma = 2.5
    args = dict(class_labels=[3, 5]) if kind == "class-image" else dict(prompt=["a", "b"], height=8, width=8,
                                                                         num_frames=3)
    seen = []
    pipe.transformer.register_forward_pre_hook(
        lambda m, a, kw: seen.append((kw["hidden_states"] if "hidden_states" in kw else a[0]).detach().clone()),
        with_kwargs=True)
    drawn = pipe(**args, generator=gen(0), guidance_scale=1.0, num_inference_steps=2, output_type="latent")
    if kind == "class-image":
        shape = seen[0].shape
    else:
        shape = (2, pipe.transformer.config.in_channels, *seen[0].shape[2:])
    given = pipe(**args, latents=randn_tensor(shape, generator=gen(0), dtype=torch.float32), guidance_scale=1.0,
                 num_inference_steps=2, output_type="latent")
    assert torch.equal(seen[0], seen[2])
    first = drawn.images if kind == "class-image" else drawn.frames
    second = given.images if kind == "class-image" else given.frames
    assert torch.allclose(torch.as_tensor(first), torch.as_tensor(second))

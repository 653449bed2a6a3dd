"""What the pipelines' sampling loop computes, on stand-in transformers whose prediction is known in closed form:
the model is called once per step with the scheduler's timesteps in order (batch doubled under guidance), the
sample is the one the sampler's update gives, guidance moves it toward the condition by the guidance scale, and
a step count that is not a positive int is refused before anything runs."""

import numpy as np
import pytest
import torch
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config

from mediagen.models import IdentityAutoencoder
from mediagen.pipelines import (SCHEDULERS, ClassConditionalImagePipeline, TextToImagePipeline, TextToVideoPipeline,
                                make_scheduler)

STEPS = 4
NULL = 10  # DiT's null class (num_embeds_ada_norm): the unconditional half under guidance


class ClassOffsetDiT(ModelMixin, ConfigMixin):
    """Stands in for a DiT: predicts ``slope * x + offsets[class]`` and records every call's timesteps."""

    @register_to_config
    def __init__(self, in_channels: int = 1, sample_size: int = 8, patch_size: int = 2, num_embeds_ada_norm: int = 10,
                 slope: float = 0.0):
        super().__init__()
        self.offsets = torch.nn.Parameter(torch.zeros(num_embeds_ada_norm + 1), requires_grad=False)
        self.calls = []

    def forward(self, hidden_states, timestep, class_labels, return_dict=True):
        self.calls.append(timestep.detach().clone())
        return (self.config.slope * hidden_states + self.offsets[class_labels].view(-1, 1, 1, 1),)


class TextOffsetWan(ModelMixin, ConfigMixin):
    """Stands in for a Wan transformer: predicts ``slope * x + mean(text embedding)`` per sample and records every
    call's timesteps."""

    @register_to_config
    def __init__(self, in_channels: int = 1, patch_size=(1, 2, 2), slope: float = 0.0):
        super().__init__()
        self.unit = torch.nn.Parameter(torch.ones(1), requires_grad=False)  # gives the module a dtype and device
        self.calls = []

    def forward(self, hidden_states, timestep, encoder_hidden_states, attention_kwargs=None, return_dict=True):
        self.calls.append(timestep.detach().clone())
        offset = encoder_hidden_states.float().mean(dim=(1, 2)).view(-1, 1, 1, 1, 1)
        return (self.config.slope * hidden_states + offset,)


def dit_pipe(scheduler, slope=0.0, offsets=None):
    model = ClassOffsetDiT(slope=slope)
    for c, value in (offsets or {}).items():
        model.offsets.data[c] = value
    pipe = ClassConditionalImagePipeline(model, make_scheduler(scheduler), IdentityAutoencoder(latent_channels=1))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def wan_pipe(scheduler, slope=0.0, cls=TextToVideoPipeline):
    pipe = cls(TextOffsetWan(slope=slope), make_scheduler(scheduler), IdentityAutoencoder(latent_channels=1))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def noise(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def embeds(value, batch=1):
    """Text embeddings whose mean (the stand-in's offset) is ``value``."""
    return torch.full((batch, 4, 8), float(value))


def sample_dit(pipe, labels, guidance, latents):
    return pipe(labels, guidance_scale=guidance, num_inference_steps=STEPS, latents=latents.clone(),
                output_type="latent").images


def sample_wan(pipe, cond, uncond, guidance, latents):
    batch = latents.shape[0]
    return pipe(prompt_embeds=embeds(cond, batch), negative_prompt_embeds=embeds(uncond, batch), height=8, width=8,
                num_frames=3, guidance_scale=guidance, num_inference_steps=STEPS, latents=latents.clone(),
                output_type="latent").frames


# --- calls and timesteps ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("scheduler", SCHEDULERS)
@pytest.mark.parametrize("guidance", [1.0, 4.0])
@pytest.mark.parametrize("family", ["dit", "wan"])
def test_one_call_per_step_with_the_timesteps_in_decreasing_order(family, guidance, scheduler):
    """The loop calls the model once per step, each call at one timestep for the whole batch (the batch doubled
    under guidance, unconditional and conditional halves together), at the scheduler's timesteps from the noisy
    end down, strictly decreasing."""
    if family == "dit":
        pipe = dit_pipe(scheduler)
        sample_dit(pipe, [1, 2], guidance, noise(2, 1, 8, 8))
    else:
        pipe = wan_pipe(scheduler)
        sample_wan(pipe, 0.5, 0.0, guidance, noise(2, 1, 3, 8, 8))
    calls = pipe.transformer.calls
    assert len(calls) == STEPS and pipe._num_timesteps == STEPS
    batch = 4 if guidance > 1 else 2
    assert all(t.shape == (batch,) and bool((t == t[0]).all()) for t in calls), [t.tolist() for t in calls]
    seen = [float(t[0]) for t in calls]
    assert all(a > b for a, b in zip(seen, seen[1:])), f"timesteps not strictly decreasing: {seen}"
    fresh = make_scheduler(scheduler)
    fresh.set_timesteps(STEPS)
    assert seen == [float(t) for t in fresh.timesteps]


# --- known samples ---------------------------------------------------------------------------------------------

def _ddpm_alphas_cumprod():
    """alpha-bar of the linear-beta DDPM schedule the eps schedulers use (make_scheduler), in fp64."""
    return torch.cumprod(1 - torch.linspace(1e-4, 0.02, 1000, dtype=torch.float64), 0)


def expected_sample(scheduler, x, pred, first_t):
    """The sample a model with the constant prediction ``pred`` leads to, from the samplers' own equations.

    Flow (velocity) samplers integrate dx/dsigma = v from sigma = 1 (pure noise) to 0: with v constant every
    step adds (sigma_next - sigma) v, so the sample is x - v whatever the schedule. Eps samplers: a constant eps
    makes every step's clean-sample estimate x0 = (x_T - sqrt(1 - ab_T) eps) / sqrt(ab_T) the same; DDIM (eta 0)
    ends at the schedule's final alpha-bar (ab[0], set_alpha_to_one=False): sqrt(ab_0) x0 + sqrt(1 - ab_0) eps;
    DPM-Solver++ ends at sigma 0, on x0 itself."""
    x = x.double()
    if scheduler.startswith("flow"):
        return x - pred
    ab = _ddpm_alphas_cumprod()
    x0 = (x - (1 - ab[first_t]).sqrt() * pred) / ab[first_t].sqrt()
    if scheduler == "ddim":
        return ab[0].sqrt() * x0 + (1 - ab[0]).sqrt() * pred
    return x0


@pytest.mark.parametrize("scheduler", SCHEDULERS)
@pytest.mark.parametrize("guidance", [1.0, 3.0])
def test_class_image_sample_of_a_constant_model_has_its_closed_form(scheduler, guidance):
    a_cond, a_null = 0.7, -0.2
    pipe = dit_pipe(scheduler, offsets={3: a_cond, NULL: a_null})
    x = noise(1, 1, 8, 8)
    got = sample_dit(pipe, [3], guidance, x)
    pred = a_null + guidance * (a_cond - a_null) if guidance > 1 else a_cond   # classifier-free guidance
    want = expected_sample(scheduler, x, pred, int(pipe.transformer.calls[0][0]))
    torch.testing.assert_close(got.double(), want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("scheduler", SCHEDULERS)
@pytest.mark.parametrize("guidance", [1.0, 5.0])
def test_text_video_sample_of_a_constant_model_has_its_closed_form(scheduler, guidance):
    cond, uncond = 0.4, -0.3
    pipe = wan_pipe(scheduler)
    x = noise(1, 1, 3, 8, 8)
    got = sample_wan(pipe, cond, uncond, guidance, x)
    pred = uncond + guidance * (cond - uncond) if guidance > 1 else cond
    want = expected_sample(scheduler, x, pred, int(pipe.transformer.calls[0][0]))
    torch.testing.assert_close(got.double(), want, rtol=2e-5, atol=2e-5)


def test_text_to_image_sample_of_a_constant_model_has_its_closed_form():
    pipe = wan_pipe("flow-euler", cls=TextToImagePipeline)
    x = noise(1, 1, 8, 8)
    got = pipe(prompt_embeds=embeds(0.4), negative_prompt_embeds=embeds(-0.3), height=8, width=8,
               guidance_scale=2.0, num_inference_steps=STEPS, latents=x.clone(), output_type="latent").images
    torch.testing.assert_close(got[:, :, 0], x - (-0.3 + 2.0 * (0.4 + 0.3)), rtol=1e-5, atol=1e-5)


# --- guidance --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_guidance_moves_the_sample_toward_the_condition(scheduler):
    """With a model affine in x (slope * x + b) every sampler's result is affine in b, so guidance at scale g
    gives exactly out_uncond + g (out_cond - out_uncond): past the conditional sample, away from the unconditional
    one. out_uncond and out_cond are unguided runs on the unconditional and conditional input alone."""
    g, x = 4.0, noise(1, 1, 3, 8, 8)
    runs = {}
    for name, (cond, guidance) in {"uncond": (-0.3, 1.0), "cond": (0.4, 1.0), "guided": (0.4, g)}.items():
        runs[name] = sample_wan(wan_pipe(scheduler, slope=-0.5), cond, -0.3, guidance, x).double()
    toward = runs["cond"] - runs["uncond"]
    assert toward.norm() > 1e-3 * runs["cond"].norm()       # the condition changes the sample
    torch.testing.assert_close(runs["guided"], runs["uncond"] + g * toward, rtol=1e-4, atol=1e-4 * toward.abs().max())
    assert ((runs["guided"] - runs["cond"]) * toward).sum() > 0   # further toward the condition than g = 1


@pytest.mark.parametrize("scheduler", ["flow-euler", "ddim"])
def test_class_guidance_moves_the_sample_toward_the_class(scheduler):
    """The same for the class-conditional pipeline: the unconditional run is one whose class reads the null
    class's prediction."""
    g, x = 3.0, noise(1, 1, 8, 8)
    uncond = sample_dit(dit_pipe(scheduler, slope=-0.5, offsets={3: -0.2, NULL: -0.2}), [3], 1.0, x).double()
    cond = sample_dit(dit_pipe(scheduler, slope=-0.5, offsets={3: 0.7, NULL: -0.2}), [3], 1.0, x).double()
    guided = sample_dit(dit_pipe(scheduler, slope=-0.5, offsets={3: 0.7, NULL: -0.2}), [3], g, x).double()
    toward = cond - uncond
    assert toward.norm() > 1e-3 * cond.norm()
    torch.testing.assert_close(guided, uncond + g * toward, rtol=1e-4, atol=1e-4 * toward.abs().max())
    assert ((guided - cond) * toward).sum() > 0


# --- the step count --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("steps", [0, -1, True, 2.5, "4", None, np.float32(3)])
@pytest.mark.parametrize("family", ["dit", "wan", "image"])
def test_a_step_count_that_is_not_a_positive_int_is_refused_in_one_line(family, steps):
    if family == "dit":
        pipe = dit_pipe("flow-euler")
        call = lambda: pipe([1], num_inference_steps=steps)  # noqa: E731
    else:
        pipe = wan_pipe("flow-euler", cls=TextToVideoPipeline if family == "wan" else TextToImagePipeline)
        call = lambda: pipe(prompt_embeds=embeds(0.1), height=8, width=8, num_inference_steps=steps)  # noqa: E731
    with pytest.raises(ValueError, match=r"^num_inference_steps=.* is not allowed") as err:
        call()
    assert "\n" not in str(err.value) and repr(steps) in str(err.value)
    assert pipe.transformer.calls == []   # refused before sampling

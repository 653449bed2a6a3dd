"""Scheduler and batching rules of the pipelines, checked against formulas written out here: a flow
scheduler's sigmas are its unshifted sigmas under sigma' = s sigma / (1 + (s - 1) sigma) at the asked shift
(both flow samplers), the DDPM samplers use the asked number of training timesteps with linear betas, and
several videos per prompt keep each prompt next to its own negative prompt (copies of prompt i together)."""

import numpy as np
import pytest
import torch
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config

from mediagen.models import IdentityAutoencoder
from mediagen.pipelines import TextToVideoPipeline, make_scheduler


def shifted(sigma, s):
    return s * sigma / (1 + (s - 1) * sigma)


def unshifted(sigma, s):
    return sigma / (s - (s - 1) * sigma)


@pytest.mark.parametrize("name", ["flow-euler", "flow-unipc"])
@pytest.mark.parametrize("shift", [0.5, 3.0, 7.0])
def test_flow_sigmas_follow_the_asked_shift(name, shift):
    """Both flow samplers step on an even grid of unshifted sigmas from 1 down, shifted by the asked shift;
    a timestep is 1000 sigma."""
    sched = make_scheduler(name, shift)
    sched.set_timesteps(6)
    sigmas = sched.sigmas.double()
    assert float(sigmas[-1]) == 0.0 and float(sigmas[0]) == pytest.approx(1.0, abs=1e-5)
    grid = unshifted(sigmas[:-1], shift)
    steps = grid[:-1] - grid[1:]
    assert bool((steps > 0).all()) and torch.allclose(steps, steps.mean().expand_as(steps), atol=1e-5), grid
    assert torch.allclose(sched.timesteps.double(), 1000 * sigmas[:-1], atol=1.0)


@pytest.mark.parametrize("name", ["ddim", "dpm-solver"])
@pytest.mark.parametrize("T", [1000, 400])
def test_ddpm_samplers_use_the_asked_training_timesteps(name, T):
    sched = make_scheduler(name, num_train_timesteps=T)
    betas = torch.linspace(1e-4, 0.02, T, dtype=torch.float64)
    assert torch.allclose(sched.alphas_cumprod.double(), torch.cumprod(1 - betas, 0), atol=1e-6)
    sched.set_timesteps(5)
    assert int(sched.timesteps.max()) < T and int(sched.timesteps.max()) >= T * 3 // 4


class MeanTextModel(ModelMixin, ConfigMixin):
    """Predicts the mean of each sample's text embedding (a velocity constant in time)."""

    @register_to_config
    def __init__(self, in_channels: int = 1, patch_size=(1, 2, 2)):
        super().__init__()
        self.unit = torch.nn.Parameter(torch.ones(1), requires_grad=False)

    def forward(self, hidden_states, timestep, encoder_hidden_states, attention_kwargs=None, return_dict=True):
        offset = encoder_hidden_states.float().mean(dim=(1, 2)).view(-1, 1, 1, 1, 1)
        return (torch.zeros_like(hidden_states) + offset,)


@pytest.mark.parametrize("guidance", [1.0, 3.0])
def test_videos_per_prompt_stay_with_their_prompt_and_negative(guidance):
    """Flow sampling from zero latents with a constant velocity v ends at -v; v of sample i is
    u_i + g (c_i - u_i) with c_i / u_i its prompt's and negative prompt's embedding means."""
    pipe = TextToVideoPipeline(MeanTextModel(), make_scheduler("flow-euler"), IdentityAutoencoder(latent_channels=1))
    pipe.set_progress_bar_config(disable=True)
    cond, uncond, rep = [1.0, 2.0, 4.0], [-1.0, -3.0, 0.5], 2
    embeds = torch.tensor(cond).view(3, 1, 1).expand(3, 4, 8).clone()
    negative = torch.tensor(uncond).view(3, 1, 1).expand(3, 4, 8).clone()
    out = pipe(prompt_embeds=embeds, negative_prompt_embeds=negative, num_videos_per_prompt=rep, height=8, width=8,
               num_frames=3, guidance_scale=guidance, num_inference_steps=3,
               latents=torch.zeros(3 * rep, 1, 3, 8, 8), output_type="latent").frames
    velocity = [u + guidance * (c - u) if guidance > 1 else c for c, u in zip(cond, uncond)]
    want = np.repeat(-np.array(velocity), rep)
    assert out.shape[0] == 3 * rep
    assert np.allclose(out.flatten(1).mean(1).numpy(), want, atol=1e-5)
    assert np.allclose(out.flatten(1).std(1).numpy(), 0.0, atol=1e-6)

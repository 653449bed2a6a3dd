"""The sampling loop shared by our pipelines: scheduler steps, progress bar, step-end callbacks."""

from __future__ import annotations

import torch

from .schedulers import timestep_options


def guided(pred: torch.Tensor, guidance_scale: float) -> torch.Tensor:
    """Classifier-free guidance on a batch laid out [unconditional; conditional]."""
    uncond, cond = pred.chunk(2)
    return uncond + guidance_scale * (cond - uncond)


def scale_input(scheduler, x: torch.Tensor, t) -> torch.Tensor:
    return scheduler.scale_model_input(x, t) if hasattr(scheduler, "scale_model_input") else x


def run_denoising(pipe, latents, predict, num_inference_steps: int, device, state: dict,
                  callback_on_step_end=None, callback_tensor_inputs=("latents",)):
    """Run the scheduler from noise to sample.

    predict(latents, t, state) -> the model output the scheduler expects (guidance applied).
    state holds tensors a callback may read or replace (``latents``, ``prompt_embeds``, ...): a
    callback ``f(pipe, step, t, {name: tensor})`` returns a dict of replacements, as in diffusers.
    """
    scheduler = pipe.scheduler
    scheduler.set_timesteps(num_inference_steps, device=device,
                            **timestep_options(scheduler, pipe.transformer.config, latents.shape))
    timesteps = scheduler.timesteps
    pipe._num_timesteps = len(timesteps)
    pipe._interrupt = False
    with pipe.progress_bar(total=len(timesteps)) as bar:
        for i, t in enumerate(timesteps):
            if pipe._interrupt:
                break
            pred = predict(latents, t, state)
            latents = scheduler.step(pred, t, latents, return_dict=False)[0]
            if callback_on_step_end is not None:
                state["latents"] = latents
                replaced = callback_on_step_end(pipe, i, t, {k: state[k] for k in callback_tensor_inputs}) or {}
                state.update(replaced)
                latents = state["latents"]
            bar.update()
    return latents

"""Schedulers by name, each configured the way our models are trained.

    flow-euler   FlowMatchEulerDiscreteScheduler, time shift ``shift`` (Wan: 3 at 480p, 5 at 720p); with
                 ``max_shift`` the shift follows the clip's token count (``shift_for_tokens``)
    flow-unipc   UniPC on flow sigmas with the same shift (Wan's default sampler)
    ddim         DDIM on the linear-beta DDPM schedule, epsilon prediction (DiT's training schedule)
    dpm-solver   DPM-Solver++ (2M) on the same schedule

The flow schedulers expect a velocity-predicting model, DDIM/DPM-Solver a noise-predicting one;
``FLOW_SCHEDULERS`` tells the two kinds apart. Both name tuples live in ``names.py``, which imports
no diffusers, so command lines can offer them cheaply; they are re-exported here.
"""

from __future__ import annotations

import math

from diffusers import (DDIMScheduler, DPMSolverMultistepScheduler, FlowMatchEulerDiscreteScheduler,
                       UniPCMultistepScheduler)

from .names import FLOW_SCHEDULERS, SCHEDULERS

__all__ = ["SCHEDULERS", "FLOW_SCHEDULERS", "make_scheduler", "scheduler_name", "shift_for_tokens", "latent_tokens",
           "timestep_options"]

DEFAULT_SHIFT_SEQ_LEN = (256, 4096)  # diffusers' base_image_seq_len / max_image_seq_len defaults

_DDPM = dict(num_train_timesteps=1000, beta_start=0.0001, beta_end=0.02, beta_schedule="linear")


def shift_for_tokens(tokens: int, shift: float, max_shift: float | None = None,
                     seq_len=DEFAULT_SHIFT_SEQ_LEN) -> float:
    """The flow time shift for a clip of ``tokens`` transformer tokens.

    Without ``max_shift``: ``shift`` at every size. With it, diffusers' dynamic shifting (as FLUX samples): the
    log of the shift is linear in the token count, ln(shift) at seq_len[0] tokens and ln(max_shift) at seq_len[1],
    and held at those ends outside them (extended, the shift grows exponentially with the count and a clip far
    beyond the range would be sampled at sigma 1 throughout). A longer clip holds more evidence of its content at
    the same noise level, so the noise levels where the content is decided move up; training and sampling use
    this one rule.
    """
    if max_shift is None:
        return float(shift)
    return math.exp(_log_shift(tokens, math.log(shift), math.log(max_shift), *seq_len))


def _log_shift(tokens: int, base: float, top: float, lo: int, hi: int) -> float:
    """diffusers' mu: base at ``lo`` tokens, top at ``hi``, linear in between, held outside."""
    return base + (top - base) * (min(max(tokens, lo), hi) - lo) / (hi - lo)


def latent_tokens(patch_size, latent_shape) -> int:
    """Transformer tokens of latents (B, C, H, W) or (B, C, F, H, W): their positions over the patch size
    (an int patches each spatial axis, a tuple every axis)."""
    positions = math.prod(latent_shape[2:])
    if isinstance(patch_size, int):
        return positions // (patch_size ** min(2, len(latent_shape) - 2))
    return positions // math.prod(patch_size)


def timestep_options(scheduler, transformer_config, latent_shape) -> dict:
    """Extra ``set_timesteps`` arguments: ``mu`` for a scheduler configured for dynamic shifting (the token count
    from the transformer config's ``patch_size``, read only then)."""
    config = scheduler.config
    if not getattr(config, "use_dynamic_shifting", False):
        return {}
    tokens = latent_tokens(transformer_config.patch_size, latent_shape)
    return {"mu": _log_shift(tokens, config.base_shift, config.max_shift, config.base_image_seq_len,
                             config.max_image_seq_len)}


def make_scheduler(name: str, shift: float = 3.0, max_shift: float | None = None, shift_seq_len=None,
                   num_train_timesteps: int = 1000):
    """A fresh scheduler; ``shift`` applies to the flow schedulers only, ``max_shift`` / ``shift_seq_len`` (the
    token-count rule of ``shift_for_tokens``) to flow-euler only, stored in its config as diffusers' dynamic
    shifting (``use_dynamic_shifting``, ``base_shift`` / ``max_shift`` the logs of the shifts).
    ``num_train_timesteps``: the training objective's T (flow: timestep = T sigma; DDPM: T linear betas)."""
    if name not in SCHEDULERS:
        raise ValueError(f"scheduler={name!r} is not allowed: use one of {SCHEDULERS}")
    if not shift > 0:
        raise ValueError(f"shift={shift!r} is not allowed: use a number > 0")
    if max_shift is not None:
        if name != "flow-euler":
            raise ValueError(f"max_shift={max_shift!r} is not allowed with scheduler={name!r}: a shift that follows "
                             f"the token count needs flow-euler")
        if not max_shift > 0:
            raise ValueError(f"max_shift={max_shift!r} is not allowed: use a number > 0")
        lo, hi = shift_seq_len or DEFAULT_SHIFT_SEQ_LEN
        return FlowMatchEulerDiscreteScheduler(num_train_timesteps=num_train_timesteps, shift=shift,
                                               use_dynamic_shifting=True,
                                               base_shift=math.log(shift), max_shift=math.log(max_shift),
                                               base_image_seq_len=int(lo), max_image_seq_len=int(hi))
    if name == "flow-euler":
        return FlowMatchEulerDiscreteScheduler(num_train_timesteps=num_train_timesteps, shift=shift)
    if name == "flow-unipc":
        return UniPCMultistepScheduler(num_train_timesteps=num_train_timesteps, prediction_type="flow_prediction",
                                       use_flow_sigmas=True, flow_shift=shift)
    ddpm = {**_DDPM, "num_train_timesteps": num_train_timesteps}
    if name == "ddim":
        return DDIMScheduler(**ddpm, clip_sample=False, set_alpha_to_one=False, prediction_type="epsilon")
    return DPMSolverMultistepScheduler(**ddpm, algorithm_type="dpmsolver++", solver_order=2,
                                       prediction_type="epsilon")


def scheduler_name(scheduler) -> str | None:
    """The name ``make_scheduler`` would use for this scheduler's class (None if not one of ours)."""
    kinds = {FlowMatchEulerDiscreteScheduler: "flow-euler", UniPCMultistepScheduler: "flow-unipc",
             DDIMScheduler: "ddim", DPMSolverMultistepScheduler: "dpm-solver"}
    return kinds.get(type(scheduler))

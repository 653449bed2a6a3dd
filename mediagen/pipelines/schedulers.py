"""Schedulers by name, each configured the way our models are trained.

    flow-euler   FlowMatchEulerDiscreteScheduler, time shift ``shift`` (Wan: 3 at 480p, 5 at 720p)
    flow-unipc   UniPC on flow sigmas with the same shift (Wan's default sampler)
    ddim         DDIM on the linear-beta DDPM schedule, epsilon prediction (DiT's training schedule)
    dpm-solver   DPM-Solver++ (2M) on the same schedule

The flow schedulers expect a velocity-predicting model, DDIM/DPM-Solver a noise-predicting one;
``FLOW_SCHEDULERS`` tells the two kinds apart. Both name tuples live in ``names.py``, which imports
no diffusers, so command lines can offer them cheaply; they are re-exported here.
"""

from __future__ import annotations

from diffusers import (DDIMScheduler, DPMSolverMultistepScheduler, FlowMatchEulerDiscreteScheduler,
                       UniPCMultistepScheduler)

from .names import FLOW_SCHEDULERS, SCHEDULERS

__all__ = ["SCHEDULERS", "FLOW_SCHEDULERS", "make_scheduler", "scheduler_name"]

_DDPM = dict(num_train_timesteps=1000, beta_start=0.0001, beta_end=0.02, beta_schedule="linear")


def make_scheduler(name: str, shift: float = 3.0):
    """A fresh scheduler; ``shift`` applies to the flow schedulers only."""
    if name not in SCHEDULERS:
        raise ValueError(f"scheduler={name!r} is not allowed: use one of {SCHEDULERS}")
    if not shift > 0:
        raise ValueError(f"shift={shift!r} is not allowed: use a number > 0")
    if name == "flow-euler":
        return FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=shift)
    if name == "flow-unipc":
        return UniPCMultistepScheduler(num_train_timesteps=1000, prediction_type="flow_prediction",
                                       use_flow_sigmas=True, flow_shift=shift)
    if name == "ddim":
        return DDIMScheduler(**_DDPM, clip_sample=False, set_alpha_to_one=False, prediction_type="epsilon")
    return DPMSolverMultistepScheduler(**_DDPM, algorithm_type="dpmsolver++", solver_order=2,
                                       prediction_type="epsilon")


def scheduler_name(scheduler) -> str | None:
    """The name ``make_scheduler`` would use for this scheduler's class (None if not one of ours)."""
    kinds = {FlowMatchEulerDiscreteScheduler: "flow-euler", UniPCMultistepScheduler: "flow-unipc",
             DDIMScheduler: "ddim", DPMSolverMultistepScheduler: "dpm-solver"}
    return kinds.get(type(scheduler))

"""Training objectives: what the transformer sees and what it must predict.

Flow matching (rectified flow, as Wan / SD3 / SANA): with data x0, noise e and sigma in (0, 1),
    x_t = (1 - sigma) x0 + sigma e,     target v = e - x0,     timestep = 1000 sigma.
sigma comes from u ~ logit-normal(mean, std) (u = sigmoid(mean + std n)) or uniform, then the shift
    sigma = shift u / (1 + (shift - 1) u),
the same map diffusers' FlowMatchEulerDiscreteScheduler applies at sampling time.

DDPM (as DiT): t ~ U{0..T-1}, alpha_bar_t from DiT's linear betas (1e-4 .. 0.02),
    x_t = sqrt(alpha_bar_t) x0 + sqrt(1 - alpha_bar_t) e,     target e,     timestep t.

All randomness of a sample (noise, timestep, label/caption dropout) comes from generators seeded
by (seed, step, position in the global batch), so it does not depend on how the global batch is
split over processes and micro-batches, nor on whether the run was resumed. The noise comes from a
generator on the latents' device (the same numbers on any GPU; on a CPU the same as before).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..pipelines.schedulers import shift_for_tokens


def sample_key(seed: int, step: int, position: int) -> int:
    # a fixed mixing of the three numbers into one 63-bit seed
    return ((seed * 1_000_003 + step) * 1_000_033 + position) & ((1 << 63) - 1)


def sample_generator(seed: int, step: int, position: int, device="cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(sample_key(seed, step, position))


@dataclass
class NoisedBatch:
    inputs: torch.Tensor       # x_t
    timesteps: torch.Tensor    # what the transformer's timestep embedding gets
    target: torch.Tensor
    drop: torch.Tensor         # bool per sample: condition replaced by the null class / empty prompt


class Objective:
    def __init__(self, cfg):
        self.cfg = cfg
        T = cfg.num_train_timesteps
        betas = torch.linspace(1e-4, 0.02, T, dtype=torch.float64)
        self.alphas_cumprod = torch.cumprod(1.0 - betas, dim=0).float()

    def flow_sigma(self, g: torch.Generator, shift: float | None = None) -> torch.Tensor:
        c = self.cfg
        shift = c.shift if shift is None else shift
        if c.timestep_sampling == "logit-normal":
            u = torch.sigmoid(c.logit_mean + c.logit_std * torch.randn((), generator=g))
        else:
            u = torch.rand((), generator=g)
        return shift * u / (1.0 + (shift - 1.0) * u)

    def shift(self, tokens: int | None) -> float:
        """The flow shift for a batch of ``tokens``-token samples (``objective.max_shift``: by the token count, as
        the exported scheduler samples; else ``objective.shift``)."""
        c = self.cfg
        if getattr(c, "max_shift", None) is None or tokens is None:
            return c.shift
        return shift_for_tokens(tokens, c.shift, c.max_shift, tuple(c.shift_seq_len))

    def noise(self, x0: torch.Tensor, seed: int, step: int, positions: list[int], tokens: int | None = None) \
            -> NoisedBatch:
        """x0 (B, ...) clean latents; positions: each sample's index in the step's global batch; tokens: the
        transformer tokens of one sample (sets the shift under ``objective.max_shift``)."""
        shift = self.shift(tokens)
        noises, ts, drops = [], [], []
        on_cpu = x0.device.type == "cpu"
        for pos in positions:
            g = sample_generator(seed, step, pos)
            # the noise is drawn where the latents are: on a GPU, drawing a video's noise with a CPU
            # generator took longer than the training step itself (0.5 s for 64 clips of 16x64x64).
            # A device generator with the same seed gives the same noise on every GPU.
            noise_gen = g if on_cpu else sample_generator(seed, step, pos, x0.device)
            noises.append(torch.randn(x0.shape[1:], generator=noise_gen, device=x0.device))
            if self.cfg.kind == "flow":
                ts.append(self.flow_sigma(g, shift))
            else:
                ts.append(torch.randint(0, self.cfg.num_train_timesteps, (), generator=g).float())
            drops.append(bool(torch.rand((), generator=g) < self.cfg.class_dropout))
        e = torch.stack(noises).to(x0.dtype)
        t = torch.stack(ts).to(x0.device)
        shape = (-1,) + (1,) * (x0.dim() - 1)
        if self.cfg.kind == "flow":
            s = t.to(x0.dtype).view(shape)
            return NoisedBatch((1.0 - s) * x0 + s * e, t * self.cfg.num_train_timesteps, e - x0,
                               torch.tensor(drops, device=x0.device))
        ab = self.alphas_cumprod.to(x0.device)[t.long()].to(x0.dtype).view(shape)
        return NoisedBatch(ab.sqrt() * x0 + (1.0 - ab).sqrt() * e, t, e, torch.tensor(drops, device=x0.device))

    def sampling_scheduler(self) -> str:
        """The ``mediagen.pipelines`` scheduler matching this objective."""
        return "flow-euler" if self.cfg.kind == "flow" else "ddim"

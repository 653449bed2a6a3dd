"""Exponential moving average of the trainable weights: shadow = d * shadow + (1 - d) * w.

The decay warms up as min(decay, (1 + n) / (10 + n)) over the n updates so far (as diffusers'
EMAModel does), so early averages are not dominated by the random initialisation.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


class EMA:
    def __init__(self, model: torch.nn.Module, decay: float):
        self.decay = decay
        self.updates = 0
        self.shadow = {n: p.detach().clone().float() for n, p in model.named_parameters() if p.requires_grad}

    def current_decay(self) -> float:
        return min(self.decay, (1 + self.updates) / (10 + self.updates))

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        d = self.current_decay()
        pairs = [(self.shadow[n], p.detach()) for n, p in model.named_parameters() if n in self.shadow]
        shadow = [s for s, _ in pairs]
        weights = [w if w.dtype == s.dtype else w.float() for s, w in pairs]
        torch._foreach_lerp_(shadow, weights, 1.0 - d)  # one fused launch per group, not one per tensor
        self.updates += 1

    @contextmanager
    def applied(self, model: torch.nn.Module):
        """Temporarily put the EMA weights into ``model``."""
        params = dict(model.named_parameters())
        saved = {n: params[n].detach().clone() for n in self.shadow}
        with torch.no_grad():
            for n, s in self.shadow.items():
                params[n].copy_(s)
        try:
            yield model
        finally:
            with torch.no_grad():
                for n, s in saved.items():
                    params[n].copy_(s)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.shadow)

    def load_state_dict(self, tensors: dict[str, torch.Tensor], updates: int) -> None:
        missing = sorted(set(self.shadow) - set(tensors))
        if missing:
            raise ValueError(f"EMA checkpoint lacks {len(missing)} weights, e.g. {missing[:3]}")
        for n in self.shadow:
            self.shadow[n].copy_(tensors[n])
        self.updates = updates

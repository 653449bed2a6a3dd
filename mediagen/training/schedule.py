"""AdamW and the learning-rate schedule: linear warm-up, then constant or cosine decay.

    lr(s) = lr * s / warmup                                       s < warmup
    lr(s) = lr                                                    constant
    lr(s) = lr * (r + (1 - r) * (1 + cos(pi * p)) / 2)            cosine, p = (s - warmup) / (max - warmup)
with r = min_lr_ratio.
"""

from __future__ import annotations

import math

import torch


def lr_factor(step: int, *, warmup: int, total: int, schedule: str, min_ratio: float) -> float:
    if warmup and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def make_optimizer(params, optim) -> torch.optim.Optimizer:
    params = [p for p in params if p.requires_grad]
    if not params:
        raise ValueError("no trainable parameters: check finetune.mode / finetune.train_only")
    return torch.optim.AdamW(params, lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps,
                             weight_decay=optim.weight_decay)


def make_lr_scheduler(optimizer, optim, max_steps: int):
    def factor(step):
        return lr_factor(step, warmup=optim.warmup_steps, total=max_steps, schedule=optim.schedule,
                         min_ratio=optim.min_lr_ratio)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)

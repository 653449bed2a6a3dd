"""AdamW and the learning-rate schedule: linear warm-up, then constant or cosine decay.

    lr(s) = lr * (s + 1) / warmup                                 s < warmup
    lr(s) = lr                                                    constant
    lr(s) = lr * (r + (1 - r) * (1 + cos(pi * p)) / 2)            cosine, p = min(1, (s - warmup) / (max - warmup))
with r = min_lr_ratio and s the optimizer steps taken before this one (the first step trains at lr / warmup, not 0).
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


def apply_optim_config(optimizer, scheduler, optim) -> None:
    """Put the config's lr, betas, eps and weight_decay into an optimizer and schedule restored from a
    checkpoint, keeping the restored moments and schedule position. Loading a state dict brings back the
    saved run's hyper-parameters, so a resumed run given another optim.lr (or betas, ...) would silently
    train with the old ones while its config.yaml shows the new; the schedule's shape (warm-up, max_steps,
    cosine) already follows the config, and the lr now does too."""
    for group in optimizer.param_groups:
        group.update(betas=tuple(optim.betas), eps=optim.eps, weight_decay=optim.weight_decay, initial_lr=optim.lr)
    scheduler.base_lrs = [optim.lr for _ in optimizer.param_groups]
    # the lr of the next step, as LambdaLR computes it: base lr x the factor at the schedule's position
    lrs = [base * factor(scheduler.last_epoch) for base, factor in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
    for group, lr in zip(optimizer.param_groups, lrs):
        group["lr"] = lr
    scheduler._last_lr = lrs

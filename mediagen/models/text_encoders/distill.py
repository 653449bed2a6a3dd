"""Distil a ``MediagenTextEncoder`` toward MiniLM: match its token embeddings on a prompt corpus.

Loss per batch (real tokens only): MSE(student, teacher) + (1 - cos(student, teacher)) per token
+ (1 - cos) of the mean-pooled sentence embeddings + HLA's gate regularisers (``aux_loss``).
The student is causal and the teacher bidirectional, so early tokens cannot match exactly; the
sentence term keeps the pooled embedding (what MiniLM is trained for) close.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .prompts import make_prompts


def mean_pool(hidden, mask):
    """MiniLM's sentence embedding: mean over real tokens, l2-normalised."""
    m = mask[..., None].to(hidden.dtype)
    return F.normalize((hidden * m).sum(1) / m.sum(1).clamp_min(1.0), dim=-1)


def distillation_loss(student_hidden, teacher_hidden, mask, aux_loss=None):
    real = mask.bool()
    s, t = student_hidden[real].float(), teacher_hidden[real].float()
    token_mse = F.mse_loss(s, t)
    token_cos = 1 - F.cosine_similarity(s, t, dim=-1).mean()
    sent_cos = 1 - (mean_pool(student_hidden.float(), mask) * mean_pool(teacher_hidden.float(), mask)).sum(-1).mean()
    total = token_mse + token_cos + sent_cos
    if aux_loss is not None:
        total = total + aux_loss
    return total, {"token_mse": token_mse.item(), "token_cos": token_cos.item(), "sentence_cos": sent_cos.item()}


@dataclass
class DistillConfig:
    steps: int = 2000
    batch_size: int = 32
    lr: float = 3e-4
    weight_decay: float = 0.01
    max_length: int = 64
    train_prompts: int = 20000
    seed: int = 0
    log_every: int = 50
    history: list = field(default_factory=list)


def distill(student, teacher, tokenizer, config: DistillConfig | None = None, prompts: list[str] | None = None,
            device=None, progress: bool = True):
    """Train ``student`` (MediagenTextEncoder) to reproduce ``teacher``'s (MiniLM BertModel) token
    embeddings. Returns the list of logged loss dicts. The teacher stays frozen."""
    cfg = config or DistillConfig()
    device = torch.device(device) if device is not None else next(student.parameters()).device
    prompts = prompts if prompts is not None else make_prompts(cfg.train_prompts, "train", cfg.seed)
    if not prompts:
        raise ValueError("prompts is empty: distillation needs at least one prompt")
    gen = torch.Generator().manual_seed(cfg.seed)
    teacher.eval().requires_grad_(False).to(device)
    student.train().to(device)
    opt = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=cfg.lr,
                            weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr, total_steps=max(cfg.steps, 1),
                                                pct_start=0.05)
    history = []
    for step in tqdm(range(cfg.steps), desc="distill", disable=not progress):
        idx = torch.randint(len(prompts), (cfg.batch_size,), generator=gen).tolist()
        batch = tokenizer([prompts[i] for i in idx], padding=True, truncation=True,
                          max_length=cfg.max_length, return_tensors="pt").to(device)
        ids, mask = batch["input_ids"], batch["attention_mask"]
        with torch.no_grad():
            target = teacher(input_ids=ids, attention_mask=mask).last_hidden_state
        out = student(ids, mask, return_aux=True)
        loss, parts = distillation_loss(out.last_hidden_state, target, mask, out.aux_loss)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % cfg.log_every == 0 or step == cfg.steps - 1:
            history.append({"step": step, "loss": loss.item(), **parts})
    student.eval()
    return history


@torch.no_grad()
def sentence_similarity(student, teacher, tokenizer, prompts: list[str] | None = None, batch_size: int = 64,
                        max_length: int = 64, device=None) -> float:
    """Mean cosine similarity between the student's and MiniLM's sentence embeddings on held-out prompts."""
    prompts = prompts if prompts is not None else make_prompts(256, "heldout")
    device = torch.device(device) if device is not None else next(student.parameters()).device
    sims = []
    for i in range(0, len(prompts), batch_size):
        batch = tokenizer(prompts[i:i + batch_size], padding=True, truncation=True, max_length=max_length,
                          return_tensors="pt").to(device)
        ids, mask = batch["input_ids"], batch["attention_mask"]
        s = mean_pool(student(ids, mask).last_hidden_state.float(), mask)
        t = mean_pool(teacher(input_ids=ids, attention_mask=mask).last_hidden_state.float(), mask)
        sims.append((s * t).sum(-1))
    return torch.cat(sims).mean().item()

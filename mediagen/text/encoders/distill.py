"""Distil a ``MediagenTextEncoder`` toward MiniLM: match its token embeddings on a prompt corpus.

Loss per batch (real tokens only): MSE(student, teacher) + (1 - cos(student, teacher)) per token
+ (1 - cos) of the mean-pooled sentence embeddings + HLA's gate regularisers (``aux_loss``).
The student is causal and the teacher bidirectional, so early tokens cannot match exactly; the
sentence term keeps the pooled embedding (what MiniLM is trained for) close.

With a ``reader`` (``CrossAttentionReader``: what a diffusion transformer computes from the token
states, its text projection and every cross-attention's keys and values) the loss adds
``DistillConfig.reader_weight`` times the relative squared error of those reads: the student then
spends its capacity on the directions the video models attend to, not on every direction of MiniLM's
384 equally.

``DistillConfig.train_only="attention"`` trains the attention modules and every norm only, leaving the
embeddings and FFNs copied from MiniLM frozen, so that a slim checkpoint (``slim.py``) stores about
a sixth of the weights. ``time_limit`` bounds the loop's wall time: after a few steps the step count
is cut to what fits (the learning-rate schedule still anneals to its end), and the loop stops anyway
once the limit has passed.
"""

from __future__ import annotations

import re
import time
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


def reader_error(reader, student_hidden, teacher_reads, mask):
    """Mean over ``reader``'s outputs of the relative squared error on real tokens,
    sum ||r(s) - r(t)||^2 / sum ||r(t)||^2; ``teacher_reads`` is ``reader`` of the teacher's states.
    Padded positions are zeroed first, as the pipelines hand them to the transformer."""
    real = mask.bool()
    reads = reader(student_hidden * mask[..., None].to(student_hidden.dtype))
    errors = [((a[real].float() - b[real].float()) ** 2).sum() / (b[real].float() ** 2).sum().clamp_min(1e-12)
              for a, b in zip(reads, teacher_reads)]
    return torch.stack(errors).mean()


class CrossAttentionReader(torch.nn.Module):
    """What Wan-style transformers read from text token states: per transformer its text projection
    (``condition_embedder.text_embedder``), then per block the cross-attention's keys (after
    ``norm_k``) and values. Frozen; gradients pass through it to the states."""

    def __init__(self, transformers):
        super().__init__()
        self.transformers = torch.nn.ModuleList(transformers)
        for t in self.transformers:
            t.requires_grad_(False)
            t.eval()

    def forward(self, states):
        reads = []
        for t in self.transformers:
            text = t.condition_embedder.text_embedder(states)
            for block in t.blocks:
                attn = block.attn2
                key = attn.to_k(text)
                reads += [attn.norm_k(key) if getattr(attn, "norm_k", None) is not None else key, attn.to_v(text)]
        return reads


# train_only presets: a regular expression searched in parameter names
TRAIN_ONLY = {"attention": r"\.attn\.|norm"}                          # layers.i.attn.*, every LayerNorm/RMSNorm


def trainable_names(model, train_only: str | None) -> list[str]:
    """Names of the parameters ``train_only`` selects: None or "all" (every one), "attention" (the
    attention modules and the norms), or a regular expression searched in parameter names."""
    names = [n for n, _ in model.named_parameters()]
    if train_only in (None, "all"):
        return names
    pattern = TRAIN_ONLY.get(train_only, train_only)
    try:
        regex = re.compile(pattern)
    except re.error as err:
        raise ValueError(f"train_only={train_only!r} is neither a preset ({', '.join(['all', *TRAIN_ONLY])}) "
                         f"nor a valid regular expression: {err}") from err
    picked = [n for n in names if regex.search(n)]
    if not picked:
        raise ValueError(f"train_only={train_only!r} selects no parameter; names look like {names[:3]}")
    return picked


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
    train_only: str | None = None          # None/"all", "attention" (attention + norms) or a name regex
    time_limit: float | None = None        # seconds for the loop; fewer steps if needed, never longer
    reader_weight: float = 1.0             # weight of reader_error when distill is given a reader
    history: list = field(default_factory=list)


def _one_cycle(opt, cfg, total: int, done: int = 0):
    total = max(total, 1)
    # warm-up over 5% of the steps; OneCycleLR divides by (warm-up steps - 1), zero at exactly 20 steps
    pct = 0.05 if abs(0.05 * total - 1.0) > 1e-9 else 0.06
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr, total_steps=total, pct_start=pct)
    for _ in range(done):                                              # resume a re-planned schedule
        sched.step()
    return sched


def distill(student, teacher, tokenizer, config: DistillConfig | None = None, prompts: list[str] | None = None,
            device=None, progress: bool = True, reader=None):
    """Train ``student`` (MediagenTextEncoder) to reproduce ``teacher``'s (MiniLM BertModel) token
    embeddings, and with ``reader`` (e.g. ``CrossAttentionReader``) what a downstream model reads from
    them. Returns the list of logged loss dicts (the last one is the last step taken; it has
    ``"stopped": "time_limit"`` when the time limit cut the run short). The teacher stays frozen;
    parameters ``config.train_only`` leaves out are not changed (their requires_grad is restored)."""
    cfg = config or DistillConfig()
    device = torch.device(device) if device is not None else next(student.parameters()).device
    prompts = prompts if prompts is not None else make_prompts(cfg.train_prompts, "train", cfg.seed)
    if not prompts:
        raise ValueError("prompts is empty: distillation needs at least one prompt")
    if cfg.time_limit is not None and cfg.time_limit <= 0:
        raise ValueError(f"time_limit={cfg.time_limit} must be > 0 seconds (or None)")
    if cfg.reader_weight < 0:
        raise ValueError(f"reader_weight={cfg.reader_weight} must be >= 0")
    gen = torch.Generator().manual_seed(cfg.seed)
    teacher.eval().requires_grad_(False).to(device)
    student.train().to(device)
    picked = set(trainable_names(student, cfg.train_only))
    was = {n: p.requires_grad for n, p in student.named_parameters()}
    for n, p in student.named_parameters():
        p.requires_grad_(was[n] and n in picked)
    params = [p for p in student.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    total = cfg.steps
    sched = _one_cycle(opt, cfg, total)
    probe = min(25, max(total // 20, 5))                               # steps timed before re-planning
    history, stopped = [], None
    start = probe_start = time.perf_counter()
    bar = tqdm(total=total, desc="distill", disable=not progress)
    step = 0
    try:
        while step < total:
            idx = torch.randint(len(prompts), (cfg.batch_size,), generator=gen).tolist()
            batch = tokenizer([prompts[i] for i in idx], padding=True, truncation=True,
                              max_length=cfg.max_length, return_tensors="pt").to(device)
            ids, mask = batch["input_ids"], batch["attention_mask"]
            with torch.no_grad():
                target = teacher(input_ids=ids, attention_mask=mask).last_hidden_state
                target_reads = None if reader is None else reader(target * mask[..., None].to(target.dtype))
            out = student(ids, mask, return_aux=True)
            loss, parts = distillation_loss(out.last_hidden_state, target, mask, out.aux_loss)
            if reader is not None:
                read_err = reader_error(reader, out.last_hidden_state, target_reads, mask)
                loss = loss + cfg.reader_weight * read_err
                parts["reader_error"] = read_err.item()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            bar.update(1)
            elapsed = time.perf_counter() - start
            if cfg.time_limit is not None and step == 1:
                probe_start = time.perf_counter()                      # after the first steps' warm-up
            if cfg.time_limit is not None and step == 1 + probe:      # re-plan to fit the time limit
                per_step = (time.perf_counter() - probe_start) / probe
                fits = step + 1 + int((cfg.time_limit - elapsed) / per_step * 0.95)
                if fits < total:
                    total = max(step + 2, fits)
                    sched = _one_cycle(opt, cfg, total, done=step + 1)
                    bar.total = total
                    bar.refresh()
            last = step == total - 1
            if cfg.time_limit is not None and elapsed > cfg.time_limit and not last:
                stopped, last = "time_limit", True
            if step % cfg.log_every == 0 or last:
                history.append({"step": step, "loss": loss.item(), **parts})
            if stopped:
                history[-1]["stopped"] = stopped
                break
            step += 1
    finally:
        bar.close()
        for n, p in student.named_parameters():
            p.requires_grad_(was[n])
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


@torch.no_grad()
def token_similarity(student, teacher, tokenizer, prompts: list[str], batch_size: int = 64, max_length: int = 64,
                     device=None) -> float:
    """Mean cosine similarity between the student's and MiniLM's token states over the real tokens of
    ``prompts`` (special tokens included): the states a diffusion transformer cross-attends to, where
    the sentence embedding is only their mean. A causal student's first token sees nothing of the
    prompt, so this stays below 1 even for a perfect student."""
    device = torch.device(device) if device is not None else next(student.parameters()).device
    total, count = 0.0, 0
    for i in range(0, len(prompts), batch_size):
        batch = tokenizer(prompts[i:i + batch_size], padding=True, truncation=True, max_length=max_length,
                          return_tensors="pt").to(device)
        ids, mask = batch["input_ids"], batch["attention_mask"]
        real = mask.bool()
        s = student(ids, mask).last_hidden_state.float()[real]
        t = teacher(input_ids=ids, attention_mask=mask).last_hidden_state.float()[real]
        total += F.cosine_similarity(s, t, dim=-1).sum().item()
        count += int(real.sum())
    return total / max(count, 1)


@torch.no_grad()
def read_similarity(student, teacher, tokenizer, prompts: list[str], reader, batch_size: int = 64,
                    max_length: int = 64, device=None) -> float:
    """1 - ``reader_error`` over ``prompts``: how closely a downstream model's reads of the student's
    token states match its reads of MiniLM's (1.0 = identical)."""
    device = torch.device(device) if device is not None else next(student.parameters()).device
    errors, weights = [], []
    for i in range(0, len(prompts), batch_size):
        batch = tokenizer(prompts[i:i + batch_size], padding=True, truncation=True, max_length=max_length,
                          return_tensors="pt").to(device)
        ids, mask = batch["input_ids"], batch["attention_mask"]
        t = teacher(input_ids=ids, attention_mask=mask).last_hidden_state
        reads = reader(t * mask[..., None].to(t.dtype))
        errors.append(reader_error(reader, student(ids, mask).last_hidden_state, reads, mask).item())
        weights.append(len(ids))
    return 1.0 - sum(e * w for e, w in zip(errors, weights)) / sum(weights)

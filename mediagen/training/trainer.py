"""The training loop: one optimizer step = one global batch, split over processes and micro-batches.

    for step in start+1 .. max_steps:
        for each micro-batch m of this process:
            x0 = latents(pixels); x_t, t, target = objective(x0, seed, step, positions)
            loss = f * mse(model(x_t, t, condition), target) [+ w * mse(model, teacher(x_t, t, condition or template))]
            backward(loss / accumulation)          (gradients synchronised on the last micro-batch)
        (sequence parallel: sum the processes' gradient shares)
        clip, AdamW step, LR schedule step, Mc clipping (MHLA), EMA update
        log; sample every N; checkpoint every N (atomic)
        past train.time_limit_minutes, or after a SIGTERM: checkpoint and stop (the same command resumes)

A run without checkpoint.resume starts only in an output_dir that holds no earlier run (config.yaml,
metrics.jsonl, checkpoints/, pipeline/, ...): it refuses at once, saying how to resume, unless
overwrite_output_dir=true asks to delete that run and start over (done once everything is built).
config.yaml is written when the run starts, after everything the config builds (dataset, model,
optimizer) was built, so a run that fails on its config leaves an existing run's config.yaml as it
was. metrics.jsonl holds one line per step: a run that starts at step S (0, or a resumed checkpoint's
step) first drops the lines past S, then appends. A resumed run already at train.max_steps (or past it)
says so and trains nothing; one resumed from a checkpoint of another model says so in one line.

A video that cannot be decoded mid-run (data.bad_videos=stop) stops the run with one line naming the
file, after a checkpoint of the last finished step (one process), so the same command with
checkpoint.resume=latest goes on once the file is fixed, removed or skipped.

Everything random in a step is a function of (seed, step, position in the global batch), and the
batches are a function of (seed, step) (``data.sampler``), so a resumed run repeats exactly the
losses it would have had, and 1 or 2 GPUs see the same global batches.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from ..attention import register_mix_clipping
from ..attention.sequence_parallel import sum_gradients
from ..models.identity_autoencoder import IdentityAutoencoder
from ..pipelines.schedulers import latent_tokens
from . import checkpoint as ckpt
from .components import Components, build_components
from .conditioning import Conditioner
from .config import COMPILE_SCOPES, ConfigError, save_config
from .data import build_dataset, collate
from .data.latent_cache import cache_tag
from .data.sampler import MicroBatchSampler, StepBatches, check_micro_split
from .data.video_folder import VideoReadError
from .ema import EMA
from .export import save_final_pipeline, write_samples
from .objectives import Objective
from .schedule import apply_optim_config, make_lr_scheduler, make_optimizer


class Indexed(Dataset):
    """Adds each item's index (the key of the latent cache; an item the dataset took from another index,
    in place of an unreadable video, keeps that index). A video that cannot be read becomes
    {"unreadable": message}: raised in a loader worker, the error would reach the training loop as a
    multi-line traceback of the worker, so the loop raises it itself, as one line."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        try:
            item = self.dataset[i]
        except VideoReadError as err:
            return {"unreadable": str(err), "index": i}
        return {"index": i, **item}


def indexed_collate(items):
    bad = [it["unreadable"] for it in items if "unreadable" in it]
    if bad:
        return {"unreadable": bad, "index": [it["index"] for it in items]}
    batch = collate(items)
    batch["index"] = [it["index"] for it in items]
    return batch


def stop_on_unreadable(run: Run, step: int, last_saved: int, messages: list[str]) -> None:
    """A batch of step ``step`` holds a video that cannot be decoded (data.bad_videos=stop): checkpoint the
    last finished step when it is not saved yet (one process: with several, the others wait in the
    step's gradient exchange), then raise the one line that names the file and how to go on."""
    note = f"the last checkpoint is step {last_saved}" if last_saved > 0 else "no checkpoint was written"
    if step - 1 > last_saved and run.accelerator.num_processes == 1:
        save_checkpoint(run, step - 1)
        note = f"checkpoint of step {step - 1} written"
    raise ValueError(f"{messages[0]}; stopped at step {step} (data.bad_videos='stop'), {note}: re-encode or remove "
                     f"the file (or set data.bad_videos=skip) and run again with checkpoint.resume=latest")


@dataclass
class Run:
    cfg: object
    accelerator: object
    components: Components
    model: torch.nn.Module        # as prepared by accelerate (DDP/FSDP wrapper or the model)
    unwrapped: torch.nn.Module
    optimizer: object
    scheduler: object
    objective: Objective
    conditioner: Conditioner
    ema: EMA | None = None
    losses: dict = field(default_factory=dict)
    cpu_bf16: bool = False        # a CPU run in bf16 autocast (cpu_precision); on a GPU accelerate autocasts

    def autocast(self):
        if self.cpu_bf16:
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return self.accelerator.autocast()


def native_cpu_bf16() -> bool:
    """Whether this CPU computes bf16 matmuls natively (AVX512-BF16 or AMX); elsewhere it is emulated."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def cpu_precision(precision: str) -> str:
    """The precision a CPU run trains in. bf16 autocast stays where the CPU has bf16 units (the 17M-parameter
    video model's training step runs about 2.5x faster than fp32 there); emulated bf16 runs ~20x slower than
    fp32 and fp16 autocast has no CPU kernels for most ops, so those fall back to fp32, saying so."""
    if precision == "no" or (precision == "bf16" and native_cpu_bf16()):
        return precision
    why = "this CPU has no native bf16" if precision == "bf16" else "fp16 autocast needs a GPU"
    if int(os.environ.get("RANK", "0")) == 0:   # said once per run, not once per process of a launch
        print(f"train.mixed_precision={precision!r}: {why}, so training runs in fp32")
    return "no"


def training_compile_options() -> dict:
    """Inductor options for the compiled training step (``train.compile``): mix-order reduction off.

    That fusion (on by default on GPUs since torch 2.10) computes a norm's row sums and column sums in one
    kernel. Where several column sums are slices of one parameter's gradient, as Wan's ``scale_shift_table``
    is chunked into shift, scale and gate, the fused kernel's sums never reach that gradient's buffer, which
    keeps stale or uninitialised memory (pytorch/pytorch#193061; torch 2.14.1's Inductor still writes them to
    a new tensor): with it, Wan2.1-1.3B's gradient norm is ~1e5 against ~2 eager (docs/RESULTS.md). Sampling
    compiles forward only and keeps it."""
    from torch._inductor import config

    return {"triton.mix_order_reduction": False} if hasattr(config.triton, "mix_order_reduction") else {}


def compile_for_training(model, scope: str = "model") -> None:
    """``train.compile``: compiles ``model``'s forward in place (parameter names, checkpoints and EMA stay those
    of the plain model) with ``training_compile_options``. ``scope`` "model": one graph for the whole forward;
    "blocks": each of the model's repeated blocks (diffusers' ``_repeated_blocks``, as ``compile_repeated_blocks``)
    its own graph, which gradient checkpointing then wraps like an eager block, so what a step holds cannot depend
    on how Inductor orders one graph across all the layers."""
    options = training_compile_options() or None
    if scope == "model":
        model.compile(options=options)
        return
    if scope != "blocks":
        raise ConfigError(f"train.compile_scope={scope!r} is not allowed: use one of {COMPILE_SCOPES}")
    try:
        model.compile_repeated_blocks(options=options)
    except (AttributeError, ValueError) as e:  # no diffusers model, or none of its repeated blocks in it
        raise ConfigError(f"train.compile_scope='blocks' is not allowed for {type(model).__name__}: it names no "
                          f"repeated blocks (_repeated_blocks) found in it; use 'model'") from e


def make_accelerator(cfg):
    from accelerate import Accelerator, FullyShardedDataParallelPlugin

    world = int(os.environ.get("WORLD_SIZE", "1"))
    plugin = None
    if cfg.train.distributed == "fsdp" and world > 1:
        if cfg.optim.ema_decay > 0:
            raise ValueError("optim.ema_decay > 0 is not supported with train.distributed='fsdp' (sharded weights)")
        plugin = FullyShardedDataParallelPlugin(use_orig_params=True, state_dict_type="FULL_STATE_DICT")
    # accelerate's state is one per process and refuses a second precision, so on a CPU it stays in fp32 and a
    # bf16 run autocasts itself (Run.autocast): two runs of different precision can share one Python session
    precision = cfg.train.mixed_precision if torch.cuda.is_available() else "no"
    # cpu=True without a GPU: accelerate then joins processes launched by torchrun / accelerate launch
    # with the gloo backend (without it, each CPU process would train alone)
    return Accelerator(mixed_precision=precision, fsdp_plugin=plugin, cpu=not torch.cuda.is_available())


def batch_split(cfg, world: int) -> tuple[int, int]:
    """(micro-batch per process, accumulation steps) for the global ``train.batch_size``. The accumulation
    holds for every step: with train.bucket_batch_sizes, a step of bucket j has micro-batches of
    bucket_batch_sizes[j] / (world x accumulation), and each entry must divide so."""
    g = cfg.train.batch_size
    micro = cfg.train.micro_batch_size or g // world
    if micro < 1 or g % (micro * world):
        raise ValueError(f"train.batch_size={g} must be a multiple of train.micro_batch_size={micro} x "
                         f"{world} processes")
    accumulation = g // (micro * world)
    check_micro_split(list(cfg.train.bucket_batch_sizes), world, accumulation)
    return micro, accumulation


def step_plan(cfg, dataset) -> StepBatches:
    """The items of every step: ``dataset``'s buckets cut into global batches of ``train.batch_size``, or of
    ``train.bucket_batch_sizes[j]`` for bucket j (one entry per bucket, each at most the bucket's items)."""
    buckets = dataset.bucket_ids() if hasattr(dataset, "bucket_ids") else [0] * len(dataset)
    count = dataset.num_buckets() if hasattr(dataset, "num_buckets") else None
    per_bucket = list(cfg.train.bucket_batch_sizes)
    return StepBatches(buckets, per_bucket or cfg.train.batch_size, cfg.train.seed, count)


def _disable_builtin_label_dropout(model) -> None:
    """DiT's label embedding drops labels with the global RNG; we drop them ourselves (seeded per
    sample), so the null-class row stays but its own dropout is switched off."""
    from diffusers.models.embeddings import LabelEmbedding

    for m in model.modules():
        if isinstance(m, LabelEmbedding):
            m.dropout_prob = 0.0


def predict(run: Run, model, inputs, timesteps, batch, drop, device, caption_key: str = "caption"):
    comp = run.components
    if comp.task == "class-to-image":
        null = model.config.num_embeds_ada_norm if hasattr(model, "config") else run.unwrapped.config.num_embeds_ada_norm
        labels = torch.where(drop, torch.full_like(batch["label"], null), batch["label"].to(device))
        out = model(inputs, timestep=timesteps, class_labels=labels, return_dict=False)[0]
    else:
        captions = ["" if d else c for c, d in zip(batch[caption_key], drop.tolist())]
        context = run.conditioner.text_states(captions, device)
        out = model(hidden_states=inputs, timestep=timesteps, encoder_hidden_states=context, return_dict=False)[0]
    channels = inputs.shape[1]
    return out[:, :channels] if out.shape[1] == 2 * channels else out  # learned sigma: keep the mean


def compute_loss(run: Run, batch, step: int, positions: list[int]):
    device = run.accelerator.device
    # encoded clips (data.dataset=latent-cache) come as latents; pixels go through the autoencoder (or its cache)
    x0 = (batch["latents"].to(device) if "latents" in batch
          else run.conditioner.latents(batch["pixels"], batch["index"], device))
    if run.components.task == "text-to-image" and x0.dim() == 4:
        x0 = x0.unsqueeze(2)  # a Wan transformer sees an image as a one-frame video
    tokens = latent_tokens(run.unwrapped.config.patch_size, x0.shape) if run.cfg.objective.max_shift else None
    noised = run.objective.noise(x0.float(), run.cfg.train.seed, step, positions, tokens)
    if "label" in batch:
        batch["label"] = batch["label"].to(device)
    with run.autocast():
        pred = predict(run, run.model, noised.inputs, noised.timesteps, batch, noised.drop, device)
        loss = F.mse_loss(pred.float(), noised.target.float())
        weight = size_weight(run.cfg, batch)
        distill = None
        if run.components.teacher is not None:
            # teacher_caption=template: the teacher reads the clip's template caption, so the student learns
            # to read any wording of it as the template (the same noise, timestep and dropped prompts)
            key = ("template_caption" if run.cfg.finetune.teacher_caption == "template" and "template_caption" in batch
                   else "caption")  # without varied captions (data.varied_captions=0) every caption is the template
            with torch.no_grad():
                teacher = predict(run, run.components.teacher, noised.inputs, noised.timesteps, batch, noised.drop,
                                  device, key)
            distill = F.mse_loss(pred.float(), teacher.float())
    total = run.cfg.objective.flow_weight * loss
    if distill is not None:
        total = total + run.cfg.finetune.distill_weight * distill
    return total * weight if weight != 1.0 else total, loss.detach(), distill


def size_weight(cfg, batch) -> float:
    """The factor objective.size_weighting puts on a batch's loss: (the pixels of one of its clips / the
    configured clip's) ** power. A mean loss gives a batch of small clips as much pull as one of large
    clips, so with mixed sizes under Adam the large clips, whose few ink pixels are a small share of
    the mean, learn slowest; power 1 makes every pixel count the same whatever its clip's size."""
    power = cfg.objective.size_weighting
    if not power:
        return 1.0
    if "pixels" not in batch:
        raise ConfigError(f"objective.size_weighting={power} is not allowed with data.dataset="
                          f"{cfg.data.dataset}: it weighs batches by their pixels, which encoded clips do not "
                          "carry; use 0")
    pixels = batch["pixels"]
    per_clip = pixels[0].numel() / cfg.data.channels
    nominal = cfg.data.resolution ** 2 * (cfg.data.num_frames if pixels.dim() == 5 else 1)
    return float((per_clip / nominal) ** power)


def check_sample_classes(cfg, comp: Components) -> None:
    """logging.sample_classes against the class-conditional model's labels: a class it lacks would stop the run
    at its first sample step, which comes before that step's checkpoint, so it is refused before training."""
    if comp.task != "class-to-image" or not cfg.logging.sample_every:
        return
    classes = list(cfg.logging.sample_classes)
    count = comp.transformer.config.num_embeds_ada_norm
    if any(c >= count for c in classes):
        raise ConfigError(f"logging.sample_classes={classes} is not allowed: the model's class indices run from 0 "
                          f"to {count - 1}", key="logging.sample_classes")


def check_pixel_channels(cfg, comp: Components) -> None:
    """data.channels against the channels of the pixels the model reads: the transformer's input in pixel space,
    the autoencoder's input otherwise. A mismatch would stop the first step with a convolution's shape error (or,
    where shapes happen to broadcast, train on the wrong target), so it is refused before training. Encoded
    clips (data.dataset=latent-cache) carry no pixels."""
    if cfg.data.dataset == "latent-cache":
        return
    vae = comp.vae
    expected = (comp.transformer.config.in_channels if isinstance(vae, IdentityAutoencoder)
                else getattr(vae.config, "in_channels", None))
    if expected is not None and cfg.data.channels != expected:
        reads = "the transformer" if isinstance(vae, IdentityAutoencoder) else "the autoencoder (model.vae)"
        raise ConfigError(f"data.channels={cfg.data.channels} is not allowed: {reads} reads pixels of {expected} "
                          f"channel{'s' if expected != 1 else ''}; use data.channels={expected}", key="data.channels")


def save_checkpoint(run: Run, step: int) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    acc, out = run.accelerator, run.cfg.output_dir
    model_state = acc.get_state_dict(run.model)
    optim_state = get_optimizer_state_dict(run.model, run.optimizer.optimizer,
                                           options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if acc.is_main_process:
        ckpt.prepare_tmp(out, step)
    acc.wait_for_everyone()
    tmp = ckpt.tmp_dir_for(out, step)
    ckpt.write_rng(tmp, acc.process_index)
    if acc.is_main_process:
        # fp16: the loss scale the run has learned, so a resumed run scales (and skips steps) as this one would
        scaler = getattr(acc, "scaler", None)
        ckpt.write_main(tmp, step=step, model_state=model_state, optimizer_state=optim_state,
                        scheduler_state=run.scheduler.state_dict(), ema=run.ema,
                        scaler_state=scaler.state_dict() if scaler is not None else None)
    acc.wait_for_everyone()
    if acc.is_main_process:
        ckpt.publish(out, step, run.cfg.checkpoint.keep_last)
    acc.wait_for_everyone()


def restore(run: Run, folder: Path) -> None:
    """Optimizer, LR schedule, fp16 loss scale, EMA and RNG from ``folder`` (the weights were loaded before
    prepare)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    state = ckpt.read_state(folder)
    set_optimizer_state_dict(run.model, run.optimizer.optimizer, ckpt.read_optimizer(folder),
                             options=StateDictOptions(full_state_dict=True))
    run.scheduler.load_state_dict(state["scheduler"])
    apply_optim_config(run.optimizer.optimizer, run.scheduler, run.cfg.optim)
    scaler = getattr(run.accelerator, "scaler", None)
    if scaler is not None and state.get("scaler"):   # absent in checkpoints of other precisions
        scaler.load_state_dict(state["scaler"])
    if run.ema is not None:
        ema = ckpt.read_ema(folder)
        if ema is None:
            raise ValueError(f"{folder} has no ema.safetensors but optim.ema_decay > 0")
        run.ema.load_state_dict({k: v.to(run.accelerator.device) for k, v in ema.items()}, state["ema_updates"])
    ckpt.restore_rng(folder, run.accelerator.process_index)


def trim_metrics(path: Path, last_step: int) -> None:
    """Keep the lines of ``path`` (metrics.jsonl) up to ``last_step``: a run that restarts at a checkpoint
    repeats the steps after it, and each step keeps one line. An unreadable line (a write cut short by a
    kill) is dropped too. Written to a temporary file and renamed, so a kill here loses nothing."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= last_step:
            kept.append(line + "\n")
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.writelines(kept)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


class Logger:
    """metrics.jsonl (one line per step, flushed), TensorBoard scalars and a tqdm bar, main process only."""

    def __init__(self, cfg, main: bool, start: int):
        self.main, self.cfg = main, cfg
        self.writer = self.bar = self.file = None
        if not main:
            return
        out = Path(cfg.output_dir)
        trim_metrics(out / "metrics.jsonl", start)
        self.file = open(out / "metrics.jsonl", "a")
        if cfg.logging.tensorboard:
            from torch.utils.tensorboard import SummaryWriter
            self.writer = SummaryWriter(str(out / "tensorboard"), purge_step=start + 1)
        if cfg.logging.progress:
            from tqdm.auto import tqdm
            self.bar = tqdm(total=cfg.train.max_steps, initial=start, desc="train", unit="step", dynamic_ncols=True)

    def step(self, step: int, metrics: dict) -> None:
        if not self.main:
            return
        self.file.write(json.dumps(dict(step=step, **metrics)) + "\n")
        self.file.flush()
        if self.writer is not None and (step % self.cfg.logging.every == 0 or step == 1):
            for k, v in metrics.items():
                self.writer.add_scalar(f"train/{k}", v, step)
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{metrics['loss']:.4f}", lr=f"{metrics['lr']:.2e}",
                                 samples_s=f"{metrics['samples_per_s']:.1f}")
            self.bar.update(1)

    def close(self):
        for h in (self.bar, self.writer, self.file):
            if h is not None:
                h.close()


def out_of_time(acc, started: float, limit_minutes: float, terminated: bool = False) -> bool:
    """True on every process once any process has run past the limit or was sent SIGTERM
    (the processes stop together)."""
    late = terminated or (limit_minutes > 0 and time.monotonic() - started > 60.0 * limit_minutes)
    if acc.num_processes == 1:
        return late
    return bool(acc.reduce(torch.tensor(float(late), device=acc.device), "sum").item() > 0)


class _SigtermFlag:
    """``set`` turns True on SIGTERM while training runs (main thread only): the loop then checkpoints
    and stops, so `kill PID` (or a scheduler's preemption) loses no step and the same command resumes.
    ``restore()`` puts the previous handler back."""

    def __init__(self):
        self.set = False
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame):
        self.set = True

    def restore(self):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


def train(cfg, on_step_end=None) -> dict:
    """Run (or resume) the training ``cfg`` describes; returns {"step", "start", "losses": {step: loss},
    "finished": bool}: finished is False when train.time_limit_minutes or a SIGTERM stopped it early
    (with a checkpoint to resume from). A run resumed at or past train.max_steps trains nothing:
    losses is empty, finished True, and a line says so.

    on_step_end(step, loss) is called on every process after each optimizer step (and checkpoint).
    """
    from accelerate.utils import set_seed

    started = time.monotonic()
    acc = make_accelerator(cfg)
    out = Path(cfg.output_dir)
    overwrite = bool(cfg.get("overwrite_output_dir", False))
    ckpt.check_output_dir(out, cfg.checkpoint.resume, overwrite)  # before anything is built: fails at once
    resume_from = ckpt.find_resume(out, cfg.checkpoint.resume)
    start = ckpt.read_state(resume_from)["step"] if resume_from is not None else 0
    if start >= cfg.train.max_steps:
        if acc.is_main_process:
            print(f"already at step {start} (train.max_steps={cfg.train.max_steps}): nothing to train; "
                  f"raise train.max_steps to train further")
        acc.end_training()
        return {"step": start, "start": start, "losses": {}, "finished": True}
    set_seed(cfg.train.seed)
    # sequence parallel: every process works on the same samples (its slab of their tokens), so the
    # data, the noise and the micro-batch split are those of a single process
    sp = cfg.train.sequence_parallel and acc.num_processes > 1
    data_world, data_rank = (1, 0) if sp else (acc.num_processes, acc.process_index)
    micro, accumulation = batch_split(cfg, data_world)
    comp = build_components(cfg)
    check_sample_classes(cfg, comp)
    check_pixel_channels(cfg, comp)
    dataset = build_dataset(cfg.data, cfg.task, cfg.train.seed)
    plan = step_plan(cfg, dataset)

    model = comp.transformer
    _disable_builtin_label_dropout(model)
    if resume_from is not None:
        from omegaconf import OmegaConf

        model_config = OmegaConf.to_container(cfg.model, resolve=True) if OmegaConf.is_config(cfg.model) else None
        ckpt.load_model_state(model, resume_from, out, model_config)
    device = acc.device
    for part in (comp.vae, comp.text_encoder, comp.teacher):
        if part is not None:
            part.to(device)
    optimizer = make_optimizer(model.parameters(), cfg.optim)
    register_mix_clipping(optimizer, model)  # keeps MHLA's Mc in [0, 1]; no-op without MHLA layers
    scheduler = make_lr_scheduler(optimizer, cfg.optim, cfg.train.max_steps)
    model.train()
    if cfg.train.compile:
        compile_for_training(model, cfg.train.compile_scope)
    if sp:
        from ..models.sequence_parallel import enable_sequence_parallel

        enable_sequence_parallel(model)  # checks: all-MHLA, blocks[0] divisible by the process count
        model.to(device)
        prepared, optimizer = model, acc.prepare(optimizer)  # no DDP: gradients are summed shares
    else:
        prepared, optimizer = acc.prepare(model, optimizer)
    unwrapped = acc.unwrap_model(prepared)
    ema = EMA(unwrapped, cfg.optim.ema_decay) if cfg.optim.ema_decay > 0 else None
    conditioner = Conditioner(comp, cfg.model.text_max_length, cfg.data.cache_dir,
                              cache_tag(cfg, comp.text_encoder_name))
    run = Run(cfg, acc, comp, prepared, unwrapped, optimizer, scheduler, Objective(cfg.objective), conditioner, ema,
              cpu_bf16=device.type == "cpu" and cpu_precision(cfg.train.mixed_precision) == "bf16")
    if resume_from is not None:
        restore(run, resume_from)
    if cfg.data.cache_dir and comp.text_encoder is not None and hasattr(dataset, "all_captions"):
        with acc.main_process_first():
            conditioner.precompute_text(dataset.all_captions(), device)

    sampler = MicroBatchSampler(plan, start, cfg.train.max_steps, data_rank, data_world, accumulation)
    if cfg.data.on_device and hasattr(dataset, "render_batch"):
        batches = (dict(dataset.render_batch(ids, device), index=ids) for ids in sampler)
    else:
        loader = DataLoader(Indexed(dataset), batch_sampler=sampler, collate_fn=indexed_collate,
                            num_workers=cfg.data.num_workers, persistent_workers=False)
        batches = iter(loader)
    if acc.is_main_process:
        # everything the config describes is built: from here on this run owns output_dir
        if overwrite and cfg.checkpoint.resume is None and ckpt.earlier_run(out):
            print(f"overwrite_output_dir=true: deleted the earlier run's {', '.join(ckpt.clear_earlier_run(out))} "
                  f"in {out}")
        out.mkdir(parents=True, exist_ok=True)
        save_config(cfg, out / "config.yaml")
        if resume_from is not None:
            print(f"resuming from {resume_from} (step {start})")
    acc.wait_for_everyone()
    logger = Logger(cfg, acc.is_main_process, start)
    params = [p for p in prepared.parameters() if p.requires_grad]
    step = start
    last_saved = start  # the step of the newest checkpoint (a resumed run's own; 0: none yet)
    finished = True
    term = _SigtermFlag()  # after the loader's workers started: they keep the default handler
    try:
        for step in range(start + 1, cfg.train.max_steps + 1):
            t0 = time.perf_counter()
            total = torch.zeros((), device=device)
            distill_total = torch.zeros((), device=device)
            for m in range(accumulation):
                batch = next(batches)
                if "unreadable" in batch:
                    stop_on_unreadable(run, step, last_saved, batch["unreadable"])
                first = (m * data_world + data_rank) * sampler.micro(step)  # this step's bucket's micro-batch
                positions = list(range(first, first + len(batch["index"])))
                sync = nullcontext() if m == accumulation - 1 else acc.no_sync(prepared)
                with sync:
                    loss, mse, distill = compute_loss(run, batch, step, positions)
                    acc.backward(loss / accumulation)
                total += mse / accumulation
                if distill is not None:
                    distill_total += distill.detach() / accumulation
            if sp:  # each process holds its tokens' share of every parameter's gradient
                sum_gradients(prepared)
            grad_norm = torch.zeros(())
            if cfg.optim.max_grad_norm > 0:
                grad_norm = acc.clip_grad_norm_(params, cfg.optim.max_grad_norm)
            step_lr = optimizer.param_groups[0]["lr"]  # the rate this step trained with, before the schedule moves on
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            if ema is not None and step > cfg.optim.ema_start:
                ema.update(unwrapped)
            step_loss = acc.reduce(total, "mean").item()
            metrics = {"loss": step_loss, "lr": step_lr, "grad_norm": float(grad_norm),
                       "samples_per_s": plan.batch_size(step) / (time.perf_counter() - t0)}
            if comp.teacher is not None:
                metrics["distill"] = acc.reduce(distill_total, "mean").item()
            run.losses[step] = step_loss
            logger.step(step, metrics)
            if cfg.logging.sample_every and step % cfg.logging.sample_every == 0:
                folder = out / "samples" / f"step-{step:07d}"
                if sp:  # the sharded model samples on every process together; the main one writes
                    write_samples(run, step, folder if acc.is_main_process else None, logger.writer)
                elif acc.is_main_process and cfg.train.distributed != "fsdp":
                    write_samples(run, step, folder, logger.writer)
                acc.wait_for_everyone()
            saved = step % cfg.checkpoint.every == 0 or step == cfg.train.max_steps
            if saved:
                save_checkpoint(run, step)
                last_saved = step
            stop = step < cfg.train.max_steps and out_of_time(acc, started, cfg.train.time_limit_minutes, term.set)
            if stop and not saved:
                save_checkpoint(run, step)
                last_saved = step
            if on_step_end is not None:
                on_step_end(step, step_loss)
            if stop:
                finished = False
                if acc.is_main_process:
                    why = "SIGTERM received" if term.set else \
                        f"train.time_limit_minutes={cfg.train.time_limit_minutes} reached"
                    how = "run the same command to resume" if cfg.checkpoint.resume == "latest" else \
                        "add checkpoint.resume=latest to the same command to resume"
                    print(f"{why} at step {step} of {cfg.train.max_steps}; checkpoint written, {how}")
                break
    finally:
        term.restore()
        logger.close()
    if cfg.checkpoint.save_pipeline and start < cfg.train.max_steps and finished:
        if acc.is_main_process and not (cfg.train.distributed == "fsdp" and acc.num_processes > 1):
            save_final_pipeline(run, out / "pipeline")
        acc.wait_for_everyone()
    acc.end_training()
    return {"step": step, "start": start, "losses": run.losses, "finished": finished}

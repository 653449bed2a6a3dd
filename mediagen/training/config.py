"""The training config: omegaconf structured config built from dataclasses.

A YAML file is merged onto ``TrainConfig``; a misspelt key, a value of the wrong type or out of range,
or a YAML syntax error fails at load with one line (``ConfigError``) that names the key, the value, what
is allowed and where the value came from: the YAML file's path or "command-line override". CLI
overrides are dotlists (``optim.lr=3e-4 train.max_steps=100``). The resolved config is written next to
the checkpoints once a run starts (``save_config``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from ..models.attention_spec import ATTENTION_CHOICES, LAYER_ATTENTIONS

TASKS = ("class-to-image", "text-to-image", "text-to-video")
OBJECTIVES = ("flow", "ddpm")
TIMESTEP_SAMPLING = ("logit-normal", "uniform")
PRECISIONS = ("no", "fp16", "bf16")
DATASETS = ("mnist", "moving-mnist", "image-folder", "video-folder", "latent-cache")
SCHEDULES = ("constant", "cosine")
FINETUNE_MODES = ("none", "full", "lora", "convert")
DISTRIBUTED = ("ddp", "fsdp")
COMPILE_SCOPES = ("model", "blocks")
TEACHER_CAPTIONS = ("same", "template")
MNIST_SPLITS = ("train", "held_out", "all")   # mediagen.data.load_mnist10k; data.split of the MNIST datasets
BAD_VIDEOS = ("stop", "skip")


OVERRIDE_SOURCE = "command-line override"


class ConfigError(ValueError):
    """A config that cannot be used; the message names the key, the value and what is allowed.
    ``key`` is the dotted key at fault (None when the error is not about one key)."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


@dataclass
class ModelConfig:
    preset: Optional[str] = None            # a name from mediagen.models.presets (random init)
    pretrained: Optional[str] = None        # a saved pipeline / transformer folder (ours), a diffusers pipeline
                                            # folder with a transformer/ subfolder, or a shipped checkpoint's name
                                            # (image-mhla, video-mhla, ...)
    overrides: dict[str, Any] = field(default_factory=dict)   # preset config fields to change (e.g. num_layers)
    attention: Any = None                   # None: keep; "sdpa" | "linear" | "mhla" | "wan-mhla-h" | list per layer
    layers: Optional[list[int]] = None      # with one attention name: the layers that get it
    blocks: Optional[list[int]] = None      # MHLA blocks per grid axis (None: chosen from grid)
    grid: Optional[list[int]] = None        # token grid MHLA is chosen for (Wan needs it or blocks)
    attention_options: dict[str, Any] = field(default_factory=dict)  # feature_map, out_norm, rope, ...
    text_encoder: Optional[str] = None      # frozen. None: the one model.pretrained was trained with (its
                                            # text_encoder/ or text_encoder_ref.json), else a seeded ByteTextEncoder;
                                            # "byte", "pipeline" or a mediagen.text.encoders.load_text_encoder name
    text_max_length: int = 32
    vae: Optional[str] = None               # None: pixel space (IdentityAutoencoder); else an autoencoder folder
    gradient_checkpointing: bool = False
    text_refiner_layers: int = 0            # >0: a Wan model gets a TextRefiner of this many blocks over its
                                            # text states (models/text_refiner.py; identity at first), trained
                                            # with the rest; a pretrained model's own refiner must have as many


@dataclass
class FinetuneConfig:
    mode: str = "none"                      # none (train from scratch) | full | lora | convert
    lora_rank: int = 8
    lora_alpha: float = 8.0
    lora_targets: list[str] = field(default_factory=lambda: ["to_q", "to_k", "to_v", "to_out.0"])
    train_only: Optional[list[str]] = None  # parameter-name substrings to train (others frozen); None = all
    distill_weight: float = 0.0             # weight of MSE to a frozen teacher's output (convert: the softmax
                                            # model; full: the starting model, with teacher_caption=template)
    teacher: Optional[str] = None           # teacher folder (default: model.pretrained before conversion)
    teacher_caption: str = "same"           # same: the teacher reads the student's caption; template: the clip's
                                            # template caption, whatever wording the student reads


@dataclass
class ObjectiveConfig:
    kind: str = "flow"                      # flow (velocity, rectified flow) | ddpm (epsilon)
    timestep_sampling: str = "logit-normal"  # flow: logit-normal (SD3/SANA) or uniform
    logit_mean: float = 0.0
    logit_std: float = 1.0
    shift: float = 1.0                      # flow: sigma -> shift*s / (1 + (shift-1)*s) (Wan uses 3..5)
    max_shift: Optional[float] = None       # flow: the shift follows a batch's token count, ln(shift) at
    shift_seq_len: list[int] = field(default_factory=lambda: [256, 4096])  # shift_seq_len[0] tokens to
                                            # ln(max_shift) at shift_seq_len[1], linear in between, held beyond
                                            # (diffusers' dynamic shifting); the exported scheduler samples so
    num_train_timesteps: int = 1000
    class_dropout: float = 0.1              # probability of the null class / empty prompt (for guidance)
    flow_weight: float = 1.0                # weight of the flow (or ddpm) loss; 0: distillation alone
    size_weighting: float = 0.0             # mixed clip sizes: a batch's mean loss x (its clip's pixels / the
                                            # configured size's: data.num_frames x data.resolution^2) ** this.
                                            # 0: every batch counts alike, so a pixel of a small clip weighs
                                            # more; 1: every pixel weighs the same whatever its clip's size


@dataclass
class DataConfig:
    dataset: str = "mnist"
    path: Optional[str] = None              # image-folder / video-folder root
    split: str = "train"                    # mnist: train | held_out | all
    resolution: int = 28                    # images: side; moving-mnist: canvas side
    channels: int = 1
    num_frames: int = 8                     # moving-mnist frames; video-folder frames (or buckets)
    frame_buckets: list[int] = field(default_factory=list)          # video-folder: allowed frame counts
    resolution_buckets: list[list[int]] = field(default_factory=list)  # [[h, w], ...] for image/video folders
    num_digits: int = 1                     # moving-mnist digits per clip
    two_digit_fraction: float = 0.0         # moving-mnist with num_digits 1: share of clips showing two digits
    speed: float = 2.0                      # moving-mnist pixels per frame
    static_fraction: float = 0.0            # moving-mnist: share of clips standing still, captioned without a
                                            # direction ("the digit 3"), for prompt-mode stills
    varied_captions: float = 0.0            # moving-mnist: share of clips captioned in a wording drawn from
                                            # many ("a 3 sliding to the left"; data/wordings.py), the rest
                                            # "the digit 3 moves left"; 0 keeps the shipped models' template
    length: int = 100000                    # moving-mnist clips per epoch (generated on the fly)
    cache_dir: Optional[str] = None         # precomputed text embeddings / latents
    num_workers: int = 0
    on_device: bool = False                 # moving-mnist: draw each batch on the training device (no
                                            # loader workers; the GPU, not the CPU, then sets the pace)
    bad_videos: str = "stop"                # video-folder, a file that cannot be opened or decoded: stop (one
                                            # line naming it, after a checkpoint) | skip (train on without it)


@dataclass
class OptimConfig:
    lr: float = 1e-4
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    weight_decay: float = 0.0
    eps: float = 1e-8
    schedule: str = "constant"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0               # cosine floor, as a fraction of lr
    max_grad_norm: float = 1.0              # 0 disables clipping
    ema_decay: float = 0.0                  # 0 disables EMA
    ema_start: int = 0


@dataclass
class TrainSection:
    max_steps: int = 1000
    batch_size: int = 32                    # global batch per optimizer step (all GPUs, all micro-batches)
    micro_batch_size: int = 0               # per device per forward; 0 = batch_size / num_processes
    bucket_batch_sizes: list[int] = field(default_factory=list)  # global batch per data bucket; []: batch_size
    mixed_precision: str = "no"
    distributed: str = "ddp"                # ddp | fsdp (when launched on several processes)
    seed: int = 0
    time_limit_minutes: float = 0.0         # > 0: checkpoint and stop after this much wall time (resume later)
    compile: bool = False                   # torch.compile the transformer's forward (weights and names unchanged;
                                            # Inductor options: trainer.training_compile_options)
    compile_scope: str = "model"            # model: one graph for the whole forward | blocks: each repeated block
                                            # (diffusers' _repeated_blocks) its own graph, as compile_repeated_blocks
    sequence_parallel: bool = False         # text-to-video, all-MHLA: the launched processes share each sample's
                                            # tokens (blocks of the grid) instead of splitting the batch


@dataclass
class CheckpointConfig:
    every: int = 500
    keep_last: int = 3
    resume: Optional[str] = None            # None | "latest" | a checkpoint folder
    save_pipeline: bool = True              # write output_dir/pipeline at the end (EMA weights if any)


@dataclass
class LoggingConfig:
    every: int = 10
    tensorboard: bool = True
    progress: bool = True
    sample_every: int = 0                   # 0 disables sampling during training
    sample_steps: int = 20
    sample_prompts: list[str] = field(default_factory=list)
    sample_classes: list[int] = field(default_factory=lambda: list(range(10)))
    guidance_scale: float = 1.0


@dataclass
class TrainConfig:
    output_dir: str = MISSING
    overwrite_output_dir: bool = False      # a run without checkpoint.resume into an output_dir that holds an
                                            # earlier run: false refuses; true deletes that run's outputs first
    task: str = "class-to-image"
    model: ModelConfig = field(default_factory=ModelConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainSection = field(default_factory=TrainSection)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)


_CHOICES = {"task": TASKS, "objective.kind": OBJECTIVES, "objective.timestep_sampling": TIMESTEP_SAMPLING,
            "train.mixed_precision": PRECISIONS, "data.dataset": DATASETS, "optim.schedule": SCHEDULES,
            "finetune.mode": FINETUNE_MODES, "finetune.teacher_caption": TEACHER_CAPTIONS,
            "train.distributed": DISTRIBUTED, "train.compile_scope": COMPILE_SCOPES,
            "data.bad_videos": BAD_VIDEOS}


def _valid_keys(node_type, dotted: str) -> list[str]:
    """The field names at ``dotted`` (a path into TrainConfig), for error messages."""
    import dataclasses

    cls = node_type
    for part in [p for p in dotted.split(".") if p][:-1]:
        f = {x.name: x for x in dataclasses.fields(cls)}.get(part)
        if f is None or not dataclasses.is_dataclass(f.default_factory() if f.default_factory is not dataclasses.MISSING else None):
            return []
        cls = type(f.default_factory())
    return sorted(x.name for x in dataclasses.fields(cls))


def _explain(err: OmegaConfBaseException, source: str) -> ConfigError:
    key = getattr(err, "full_key", None) or ""
    msg = str(err).splitlines()[0]
    if "not in struct" in msg or "Key '" in msg and "not in" in msg:
        valid = _valid_keys(TrainConfig, key)
        return ConfigError(f"{source}: unknown key {key!r}; valid keys here: {valid}", key=key)
    return ConfigError(f"{source}: bad value for {key!r}: {msg}", key=key)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# key -> (test, what is allowed): numbers the code would otherwise pass on to torch, divide by or
# loop over, where a value out of range fails late (or silently trains something else)
_RANGES = {
    "optim.lr": (lambda v: _finite(v) and v > 0, "a number > 0"),
    "optim.weight_decay": (lambda v: _finite(v) and v >= 0, "a number >= 0"),
    "optim.eps": (lambda v: _finite(v) and v > 0, "a number > 0"),
    "optim.warmup_steps": (lambda v: v >= 0, "an int >= 0 (0: no warm-up)"),
    "optim.min_lr_ratio": (lambda v: _finite(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "optim.max_grad_norm": (lambda v: _finite(v) and v >= 0, "a number >= 0 (0: no clipping)"),
    "optim.ema_decay": (lambda v: _finite(v) and 0 <= v < 1, "a number in [0, 1) (0: no EMA)"),
    "optim.ema_start": (lambda v: v >= 0, "an int >= 0"),
    "train.max_steps": (lambda v: v >= 1, "an int >= 1"),
    # numpy's seed range: accelerate's set_seed hands the seed to np.random.seed
    "train.seed": (lambda v: 0 <= v < 2 ** 32, f"an int in [0, {2 ** 32 - 1}]"),
    "train.batch_size": (lambda v: v >= 1, "an int >= 1"),
    "train.micro_batch_size": (lambda v: v >= 0, "an int >= 0 (0: batch_size / number of processes)"),
    "train.bucket_batch_sizes": (lambda v: all(b >= 1 for b in v),
                                 "a list of ints >= 1, one global batch per data bucket ([]: train.batch_size)"),
    "train.time_limit_minutes": (lambda v: _finite(v) and v >= 0, "a number >= 0 (0: no limit)"),
    "checkpoint.every": (lambda v: v >= 1, "an int >= 1 (steps between checkpoints)"),
    "checkpoint.keep_last": (lambda v: v >= 0, "an int >= 0 (0: keep every checkpoint)"),
    "logging.every": (lambda v: v >= 1, "an int >= 1 (steps between TensorBoard scalars)"),
    "logging.sample_every": (lambda v: v >= 0, "an int >= 0 (0: no samples during training)"),
    "logging.sample_steps": (lambda v: v >= 1, "an int >= 1"),
    "logging.guidance_scale": (lambda v: _finite(v) and v >= 0, "a number >= 0 (<= 1: no guidance)"),
    "objective.class_dropout": (lambda v: _finite(v) and 0 <= v <= 1, "a probability in [0, 1]"),
    "objective.logit_mean": (lambda v: _finite(v), "a finite number"),
    "objective.logit_std": (lambda v: _finite(v) and v > 0, "a number > 0"),
    "objective.shift": (lambda v: _finite(v) and v > 0, "a number > 0"),
    "objective.flow_weight": (lambda v: _finite(v) and v >= 0, "a number >= 0 (0: distillation alone)"),
    "objective.size_weighting": (lambda v: _finite(v) and 0 <= v <= 2, "a number in [0, 2] (0: off, 1: per pixel)"),
    "objective.num_train_timesteps": (lambda v: v >= 1, "an int >= 1"),
    "data.resolution": (lambda v: v >= 1, "an int >= 1"),
    "data.channels": (lambda v: v >= 1, "an int >= 1"),
    "data.num_frames": (lambda v: v >= 1, "an int >= 1"),
    "data.num_digits": (lambda v: v >= 1, "an int >= 1"),
    "data.two_digit_fraction": (lambda v: _finite(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "data.length": (lambda v: v >= 1, "an int >= 1"),
    "data.static_fraction": (lambda v: _finite(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "data.varied_captions": (lambda v: _finite(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "data.num_workers": (lambda v: v >= 0, "an int >= 0 (0: load in the training process)"),
    "model.text_max_length": (lambda v: v >= 1, "an int >= 1"),
    "model.text_refiner_layers": (lambda v: v >= 0, "an int >= 0 (0: no text refiner)"),
    "finetune.lora_rank": (lambda v: v >= 1, "an int >= 1"),
    "finetune.lora_alpha": (lambda v: _finite(v) and v > 0, "a number > 0"),
    "finetune.distill_weight": (lambda v: _finite(v) and v >= 0, "a number >= 0 (0: no distillation)"),
}


def _check_attention(cfg) -> None:
    """model.attention: None, a name of ATTENTION_CHOICES, or one name of LAYER_ATTENTIONS (or null:
    keep the layer) per layer; the names the converter knows, checked before anything is built."""
    att = cfg.model.attention
    if att is None:
        return
    per_layer = f"or a list of {list(LAYER_ATTENTIONS)} (null: keep the layer), one per layer"
    if isinstance(att, str):
        if att not in ATTENTION_CHOICES:
            raise ConfigError(f"model.attention={att!r} is not allowed: use one of {list(ATTENTION_CHOICES)} "
                              f"{per_layer}", key="model.attention")
        return
    if not OmegaConf.is_list(att):
        raise ConfigError(f"model.attention={att!r} is not allowed: use one of {list(ATTENTION_CHOICES)} "
                          f"{per_layer}", key="model.attention")
    for i, name in enumerate(att):
        if name is not None and name not in LAYER_ATTENTIONS:
            raise ConfigError(f"model.attention[{i}]={name!r} is not allowed: each entry is one of "
                              f"{list(LAYER_ATTENTIONS)} or null (keep the layer)", key="model.attention")
    if cfg.model.layers is not None:
        raise ConfigError(f"model.layers={list(cfg.model.layers)} is not allowed with a per-layer "
                          "model.attention list: give one or the other", key="model.layers")


def check_config(cfg) -> None:
    """Checks omegaconf cannot express: choices, ranges, required fields, consistency. Each error
    carries the key at fault (``ConfigError.key``), so ``load_config`` can say where it came from."""
    for key, allowed in _CHOICES.items():
        value = OmegaConf.select(cfg, key)
        if value not in allowed:
            raise ConfigError(f"{key}={value!r} is not allowed: use one of {list(allowed)}", key=key)
    for key, (ok, allowed) in _RANGES.items():
        value = OmegaConf.select(cfg, key)
        if not ok(value):
            raise ConfigError(f"{key}={value!r} is not allowed: use {allowed}", key=key)
    betas = list(cfg.optim.betas)
    if len(betas) != 2 or not all(_finite(b) and 0 <= b < 1 for b in betas):
        raise ConfigError(f"optim.betas={betas} is not allowed: use two numbers in [0, 1), e.g. [0.9, 0.999]",
                          key="optim.betas")
    if cfg.data.dataset in ("mnist", "moving-mnist") and cfg.data.split not in MNIST_SPLITS:
        raise ConfigError(f"data.split={cfg.data.split!r} is not allowed: use one of {list(MNIST_SPLITS)}",
                          key="data.split")
    classes = list(cfg.logging.sample_classes)
    if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in classes):
        raise ConfigError(f"logging.sample_classes={classes} is not allowed: use class indices >= 0",
                          key="logging.sample_classes")
    if cfg.task == "class-to-image" and cfg.logging.sample_every and not classes:
        raise ConfigError(f"logging.sample_classes=[] is not allowed with logging.sample_every="
                          f"{cfg.logging.sample_every}: give the class indices to sample (or sample_every=0)",
                          key="logging.sample_classes")
    _check_attention(cfg)
    if cfg.model.preset is None and cfg.model.pretrained is None:
        raise ConfigError("model.preset and model.pretrained are both empty: give a preset name "
                          "(e.g. dit-tiny) or a pretrained folder", key="model.preset")
    if cfg.model.pretrained is not None and len(cfg.model.overrides):
        # overrides change a preset's config; a pretrained model is built from its own, so they would be dropped
        raise ConfigError(f"model.overrides={OmegaConf.to_container(cfg.model.overrides)} is not allowed with "
                          f"model.pretrained={cfg.model.pretrained!r}: they change a preset's config (a pretrained "
                          f"model keeps its own); remove them, or train model.preset", key="model.overrides")
    if cfg.data.dataset in ("image-folder", "video-folder") and not cfg.data.path:
        raise ConfigError(f"data.path is required with data.dataset={cfg.data.dataset!r}", key="data.path")
    if cfg.data.dataset == "latent-cache" and not cfg.data.cache_dir:
        raise ConfigError("data.cache_dir is required with data.dataset='latent-cache' (the folder of encoded clips: "
                          "training/data/latent_cache.py)", key="data.cache_dir")
    if cfg.objective.max_shift is not None:
        m = cfg.objective.max_shift
        if cfg.objective.kind != "flow" or isinstance(m, bool) or not isinstance(m, (int, float)) or not _finite(m) \
                or m <= 0:
            raise ConfigError(f"objective.max_shift={m!r} is not allowed: use a number > 0 with objective.kind="
                              f"'flow', or null (one shift at every size)", key="objective.max_shift")
        lens = list(cfg.objective.shift_seq_len)
        if len(lens) != 2 or not all(isinstance(n, int) and not isinstance(n, bool) for n in lens) \
                or not 0 < lens[0] < lens[1]:
            raise ConfigError(f"objective.shift_seq_len={lens} is not allowed: use two token counts [low, high] with "
                              f"0 < low < high", key="objective.shift_seq_len")
    if cfg.data.dataset == "latent-cache" and cfg.objective.size_weighting:
        raise ConfigError(f"objective.size_weighting={cfg.objective.size_weighting} is not allowed with "
                          "data.dataset='latent-cache': it weighs batches by their pixels, which encoded clips do "
                          "not carry; use 0", key="objective.size_weighting")
    if cfg.task == "class-to-image" and cfg.data.dataset != "mnist":
        # the class-conditional models (image-mhla, image-sdpa, image-linear) take digit labels, not captions
        raise ConfigError(f"data.dataset={cfg.data.dataset!r} has captions, not class labels: task='class-to-image' "
                          f"needs data.dataset='mnist'; to fine-tune a shipped model on captioned images use "
                          f"task=text-to-image with model.pretrained=video-mhla (or video-sdpa)", key="data.dataset")
    if cfg.data.on_device and cfg.data.dataset != "moving-mnist":
        raise ConfigError(f"data.on_device=true needs data.dataset='moving-mnist' (clips drawn on the device); "
                          f"data.dataset is {cfg.data.dataset!r}", key="data.on_device")
    if cfg.train.sequence_parallel and cfg.task != "text-to-video":
        raise ConfigError(f"train.sequence_parallel=true needs task='text-to-video' (a Wan-style transformer with "
                          f"MHLA in every layer); task is {cfg.task!r}", key="train.sequence_parallel")
    if cfg.train.sequence_parallel and cfg.train.distributed == "fsdp":
        raise ConfigError("train.sequence_parallel=true cannot be combined with train.distributed='fsdp'",
                          key="train.sequence_parallel")
    if cfg.finetune.mode in ("full", "lora", "convert") and cfg.model.pretrained is None:
        raise ConfigError(f"finetune.mode={cfg.finetune.mode!r} needs model.pretrained (the checkpoint to start from)",
                          key="finetune.mode")
    if cfg.finetune.mode == "convert" and cfg.model.attention is None:
        raise ConfigError("finetune.mode='convert' needs model.attention (e.g. mhla or wan-mhla-h)",
                          key="finetune.mode")
    ft = cfg.finetune
    if ft.distill_weight > 0 and not (ft.mode == "convert" or ft.mode == "full" and ft.teacher_caption == "template"):
        raise ConfigError(f"finetune.distill_weight={ft.distill_weight} applies only with finetune.mode='convert' "
                          f"(the softmax teacher), or 'full' with finetune.teacher_caption='template'; "
                          f"finetune.mode is {ft.mode!r}", key="finetune.distill_weight")
    if ft.teacher_caption == "template" and not (ft.distill_weight > 0 and cfg.task == "text-to-video"
                                                 and cfg.data.dataset == "moving-mnist"):
        raise ConfigError("finetune.teacher_caption='template' needs finetune.distill_weight > 0, task="
                          "'text-to-video' and data.dataset='moving-mnist' (the clips with a template caption)",
                          key="finetune.teacher_caption")
    if cfg.objective.flow_weight == 0 and ft.distill_weight == 0:
        raise ConfigError("objective.flow_weight=0 with finetune.distill_weight=0 leaves nothing to train: set "
                          "either > 0", key="objective.flow_weight")
    resume = cfg.checkpoint.resume
    if cfg.overwrite_output_dir and resume is not None:
        raise ConfigError(f"overwrite_output_dir=true deletes the run in output_dir; checkpoint.resume={resume!r} "
                          f"continues it: give one or the other", key="overwrite_output_dir")
    if resume not in (None, "latest") and not Path(resume).is_dir():
        raise ConfigError(f"checkpoint.resume={resume!r} is neither 'latest' nor an existing checkpoint folder",
                          key="checkpoint.resume")


def _is_set(cfg, key: str) -> bool:
    """Whether ``cfg`` (a file's or the overrides' own values, not the merged config) sets ``key``."""
    node = cfg
    for part in key.split("."):
        if not isinstance(node, DictConfig) or part not in node:
            return False
        node = node[part]
    return True


def _read_yaml(path: Path) -> DictConfig:
    try:
        loaded = OmegaConf.load(path)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        context, start = getattr(err, "context", None), getattr(err, "context_mark", None)
        if context and start is not None:   # where the construct left open began, often the real typo
            problem += f" ({context} that starts at line {start.line + 1}, column {start.column + 1})"
        raise ConfigError(f"{path}: YAML syntax error{where}: {problem}") from None
    if not isinstance(loaded, DictConfig):
        kind = "list" if OmegaConf.is_list(loaded) else type(loaded).__name__
        raise ConfigError(f"{path}: the file holds a {kind}, not a mapping of keys "
                          "(output_dir, model, data, ...)")
    return loaded


def _read_overrides(overrides) -> DictConfig:
    """The dotlist as a config, one item at a time so an unreadable one is named."""
    parsed = OmegaConf.create()
    for item in overrides:
        key, eq, _ = str(item).partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"{OVERRIDE_SOURCE} {item!r} is not KEY=VALUE (e.g. optim.lr=3e-4)")
        try:
            parsed = OmegaConf.merge(parsed, OmegaConf.from_dotlist([str(item)]))
        except (yaml.YAMLError, OmegaConfBaseException) as err:
            problem = getattr(err, "problem", None) or str(err).splitlines()[0]
            raise ConfigError(f"{OVERRIDE_SOURCE} {item!r}: the value of {key!r} cannot be read: {problem}",
                              key=key) from None
    return parsed


def load_config(path: str | Path | None = None, overrides: list[str] | tuple = ()) -> TrainConfig:
    """TrainConfig from a YAML file plus dotlist overrides, type-checked and validated. Errors are
    ConfigErrors that start with where the offending value came from: the file's path or
    "command-line override" (the dotlist; the last value given for a key wins)."""
    schema = OmegaConf.structured(TrainConfig)
    from_file = from_cli = None
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist")
        from_file = _read_yaml(path)
        try:
            schema = OmegaConf.merge(schema, from_file)
        except OmegaConfBaseException as err:
            raise _explain(err, str(path)) from None
    if overrides:
        from_cli = _read_overrides(overrides)
        try:
            schema = OmegaConf.merge(schema, from_cli)
        except OmegaConfBaseException as err:
            raise _explain(err, OVERRIDE_SOURCE) from None

    def source(key: str | None) -> str:
        if key and _is_set(from_cli, key):
            return OVERRIDE_SOURCE
        if path is not None:
            return str(path)   # set there, or left at its default: the file is where to set it
        return OVERRIDE_SOURCE if overrides else "config"

    try:
        OmegaConf.to_container(schema, throw_on_missing=True)
    except MissingMandatoryValue as err:
        key = getattr(err, "full_key", None) or "?"
        raise ConfigError(f"{source(key)}: {key} is required and not set (e.g. {key}=runs/my-run)", key=key) from None
    except OmegaConfBaseException as err:
        raise _explain(err, source(getattr(err, "full_key", None))) from None
    if schema.train.mixed_precision == "False":
        # YAML 1.1 reads a bare `no` (as in `mixed_precision: no` or the dotlist
        # `train.mixed_precision=no`) as the boolean false; it can only mean "no"
        schema.train.mixed_precision = "no"
    try:
        check_config(schema)
    except ConfigError as err:
        raise ConfigError(f"{source(err.key)}: {err}", key=err.key) from None
    return schema


def save_config(cfg, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(OmegaConf.to_yaml(cfg, resolve=True))
    tmp.replace(path)
    return path

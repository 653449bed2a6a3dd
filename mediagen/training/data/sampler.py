"""Which items go into which optimizer step, as a pure function of (seed, step).

Each epoch shuffles the items of every bucket, cuts each bucket into global batches (the items of
one optimizer step, over all processes and micro-batches; leftovers are dropped) and shuffles the
batch order. Step s is then a fixed list of items whatever the number of processes, so
- a resumed run picks up at exactly the batch it would have seen, and
- 1 GPU with gradient accumulation and 2 GPUs see the same global batches (equal loss curves).

The global batch is one size for every bucket (``train.batch_size``) or one per bucket
(``train.bucket_batch_sizes``): bucket j is cut into batches of its own size, so an epoch has
sum_j n_j // batch_j steps, and a step's batch is that of the bucket it was cut from.

Process ``rank`` of ``world`` takes, for micro-batch m, the slice
[(m * world + rank) * micro, ...+ micro) of the global batch, where micro = (that step's global
batch) / (world * accumulation).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from torch.utils.data import Sampler

BUCKET_KEY = "train.bucket_batch_sizes"


class StepBatches:
    """The global batches of every step. ``global_batch``: one int (every bucket; ``train.batch_size``,
    buckets smaller than it are left out) or a list with one global batch per bucket
    (``train.bucket_batch_sizes``): as many entries as ``num_buckets`` (default: the largest bucket id + 1),
    each >= 1 and at most its bucket's item count; otherwise a one-line ValueError."""

    def __init__(self, bucket_ids: list[int], global_batch: int | list[int], seed: int,
                 num_buckets: int | None = None):
        self.bucket_ids = np.asarray(bucket_ids)
        self.seed = seed
        count = num_buckets if num_buckets is not None else int(self.bucket_ids.max(initial=-1)) + 1
        sizes = np.bincount(self.bucket_ids, minlength=count)
        self.per_bucket = not isinstance(global_batch, (int, np.integer))
        if self.per_bucket:
            self.batch_sizes = [int(b) for b in global_batch]
            check_bucket_batches(self.batch_sizes, sizes.tolist(), count)
        else:
            self.batch_sizes = [int(global_batch)] * len(sizes)
        self.per_epoch = int(sum(n // b for n, b in zip(sizes, self.batch_sizes)))
        if self.per_epoch == 0:
            raise ValueError(f"train.batch_size={global_batch} is larger than every bucket of the dataset "
                             f"(bucket sizes {sizes.tolist()}): lower the batch size or add data")

    @lru_cache(maxsize=2)
    def _epoch(self, epoch: int) -> list[np.ndarray]:
        rng = np.random.default_rng([self.seed, epoch])
        batches = []
        for b in np.unique(self.bucket_ids):
            items = rng.permutation(np.flatnonzero(self.bucket_ids == b))
            g = self.batch_sizes[b]
            n = len(items) // g
            batches.extend(items[: n * g].reshape(n, g))
        order = rng.permutation(len(batches))
        return [batches[i] for i in order]

    def global_indices(self, step: int) -> np.ndarray:
        """Items of optimizer step ``step`` (1-based)."""
        epoch, pos = divmod(step - 1, self.per_epoch)
        return self._epoch(epoch)[pos]

    def batch_size(self, step: int) -> int:
        """The global batch of step ``step``: the batch size of its bucket."""
        return len(self.global_indices(step))


def check_bucket_batches(batches: list[int], items: list[int], count: int) -> None:
    """train.bucket_batch_sizes against the dataset: one entry per bucket, each in [1, the bucket's items]."""
    if len(batches) != count:
        raise ValueError(f"{BUCKET_KEY}={batches} is not allowed: the dataset has {count} bucket"
                         f"{'s' if count != 1 else ''} (items per bucket {items}); give one global batch per "
                         f"bucket, or [] (train.batch_size for every bucket)")
    for j, (b, n) in enumerate(zip(batches, items)):
        if b < 1:
            raise ValueError(f"{BUCKET_KEY}={batches} is not allowed: entry {j} is {b}; use ints >= 1")
        if b > n:
            raise ValueError(f"{BUCKET_KEY}={batches} is not allowed: entry {j} is {b} but bucket {j} holds {n} "
                             f"item{'s' if n != 1 else ''} (items per bucket {items}); use at most {n}")


def check_micro_split(batches: list[int], world: int, accumulation: int) -> None:
    """Every per-bucket global batch splits into ``world`` processes x ``accumulation`` micro-batches."""
    parts = world * accumulation
    for j, b in enumerate(batches):
        if b % parts:
            raise ValueError(f"{BUCKET_KEY}={batches} is not allowed: entry {j} ({b}) must be a multiple of "
                             f"{world} process{'es' if world != 1 else ''} x {accumulation} accumulation "
                             f"step{'s' if accumulation != 1 else ''} = {parts}")


class MicroBatchSampler(Sampler):
    """Yields this process's micro-batches (index lists) for steps start+1 .. end, in order. A step's
    micro-batch is its global batch / (world * accumulation) (``micro(step)``), which must divide exactly."""

    def __init__(self, plan: StepBatches, start_step: int, end_step: int, rank: int, world: int, accumulation: int):
        self.plan, self.start, self.end = plan, start_step, end_step
        self.rank, self.world, self.accumulation = rank, world, accumulation
        if plan.per_bucket:
            check_micro_split(plan.batch_sizes, world, accumulation)

    def micro(self, step: int) -> int:
        """This step's micro-batch per process."""
        return self.plan.batch_size(step) // (self.world * self.accumulation)

    def __len__(self) -> int:
        return (self.end - self.start) * self.accumulation

    def __iter__(self):
        for step in range(self.start + 1, self.end + 1):
            items = self.plan.global_indices(step)
            micro = len(items) // (self.world * self.accumulation)
            for m in range(self.accumulation):
                lo = (m * self.world + self.rank) * micro
                yield [int(i) for i in items[lo:lo + micro]]

"""Which items go into which optimizer step, as a pure function of (seed, step).

Each epoch shuffles the items of every bucket, cuts each bucket into global batches (the items of
one optimizer step, over all processes and micro-batches; leftovers are dropped) and shuffles the
batch order. Step s is then a fixed list of items whatever the number of processes, so
- a resumed run picks up at exactly the batch it would have seen, and
- 1 GPU with gradient accumulation and 2 GPUs see the same global batches (equal loss curves).

Process ``rank`` of ``world`` takes, for micro-batch m, the slice
[(m * world + rank) * micro, ...+ micro) of the global batch.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from torch.utils.data import Sampler


class StepBatches:
    def __init__(self, bucket_ids: list[int], global_batch: int, seed: int):
        self.bucket_ids = np.asarray(bucket_ids)
        self.global_batch = global_batch
        self.seed = seed
        sizes = np.bincount(self.bucket_ids)
        self.per_epoch = int(sum(n // global_batch for n in sizes))
        if self.per_epoch == 0:
            raise ValueError(f"train.batch_size={global_batch} is larger than every bucket of the dataset "
                             f"(bucket sizes {sizes.tolist()}): lower the batch size or add data")

    @lru_cache(maxsize=2)
    def _epoch(self, epoch: int) -> list[np.ndarray]:
        rng = np.random.default_rng([self.seed, epoch])
        batches = []
        for b in np.unique(self.bucket_ids):
            items = rng.permutation(np.flatnonzero(self.bucket_ids == b))
            n = len(items) // self.global_batch
            batches.extend(items[: n * self.global_batch].reshape(n, self.global_batch))
        order = rng.permutation(len(batches))
        return [batches[i] for i in order]

    def global_indices(self, step: int) -> np.ndarray:
        """Items of optimizer step ``step`` (1-based)."""
        epoch, pos = divmod(step - 1, self.per_epoch)
        return self._epoch(epoch)[pos]


class MicroBatchSampler(Sampler):
    """Yields this process's micro-batches (index lists) for steps start+1 .. end, in order."""

    def __init__(self, plan: StepBatches, start_step: int, end_step: int, rank: int, world: int, accumulation: int):
        self.plan, self.start, self.end = plan, start_step, end_step
        self.rank, self.world, self.accumulation = rank, world, accumulation
        self.micro = plan.global_batch // (world * accumulation)

    def __len__(self) -> int:
        return (self.end - self.start) * self.accumulation

    def __iter__(self):
        for step in range(self.start + 1, self.end + 1):
            items = self.plan.global_indices(step)
            for m in range(self.accumulation):
                lo = (m * self.world + self.rank) * self.micro
                yield [int(i) for i in items[lo:lo + self.micro]]

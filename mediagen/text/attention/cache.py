"""A preallocated, append-only per-layer cache for decoding (key/value tensors or MLRA latents)."""

from __future__ import annotations

import torch


class DecodeCache:
    """Named tensors of shape (B, capacity, ...) filled from the front; ``length`` tokens are valid.

    Preallocating avoids re-copying the whole cache at every step (torch.cat would), which matters
    at 128K-token contexts.
    """

    def __init__(self, batch: int, capacity: int, shapes: dict[str, tuple[int, ...]], *, dtype, device,
                 tables: dict[str, torch.Tensor] | None = None):
        """``tables``: optional per-position constants (capacity, ...) computed once for the whole
        capacity (e.g. RoPE cos / sin), so that a decode step slices them instead of recomputing."""
        self.capacity = int(capacity)
        self.length = 0
        self.buffers = {name: torch.zeros(batch, self.capacity, *shape, dtype=dtype, device=device)
                        for name, shape in shapes.items()}
        self.tables = dict(tables or {})

    def append(self, **tensors: torch.Tensor) -> None:
        n = next(iter(tensors.values())).shape[1]
        self._ensure_room(n)
        for name, t in tensors.items():
            self.buffers[name][:, self.length:self.length + n] = t
        self.length += n

    def next_slot(self) -> dict[str, torch.Tensor]:
        """Views (B, ...) of the next position of every buffer, for a kernel that writes a new token's
        entries in place (MLRA's absorbed decode step) instead of ``append``; ``advance`` counts it
        once written, so a step that fails before that leaves the cache as it was."""
        self._ensure_room(1)
        return {name: buf[:, self.length] for name, buf in self.buffers.items()}

    def advance(self) -> None:
        """Count the position that ``next_slot`` handed out as filled."""
        self._ensure_room(1)
        self.length += 1

    def _ensure_room(self, n: int) -> None:
        if self.length + n > self.capacity:
            raise ValueError(f"cache capacity={self.capacity} exceeded: holds {self.length}, adding {n}")

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.buffers[name][:, : self.length]

    def nbytes_per_token(self) -> int:
        """Bytes one token occupies in this cache (one layer)."""
        return sum(b[0, 0].numel() * b.element_size() for b in self.buffers.values())

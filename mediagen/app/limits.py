"""Bounds on what one request may ask for, checked before any work starts.

A value out of bounds raises ``gr.Error`` with a one-line message naming the input, the value given
and what is allowed, so the browser (and ``gradio_client``) shows a sentence instead of a stack
trace; the server log gets that one line too (``mediagen.app`` logger), not a traceback. The page's
inputs hand their raw values to these checks (``fields.py``), so Gradio's own nameless checks
(rounding 2.5 to 2, "could not convert 'abc'") never answer first.

The default bounds follow the device (``Limits.for_device``): a CPU takes minutes where a GPU takes
seconds, so it gets smaller sizes and a lower cap on steps; and a request whose estimated time (``TimeBudget``,
from this server's own earlier requests) is past ``max_request_s`` is refused with the estimate.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

log = logging.getLogger("mediagen.app")


def _error(message: str) -> Exception:
    """``gr.Error(message)`` without a traceback in the log (one line there instead); gradio is
    imported on use, so ``mediagen --help`` stays quick."""
    import gradio as gr

    log.warning("rejected: %s", message)
    return gr.Error(message, print_exception=False)


def rejected(message: str) -> Exception:
    """The error for a bad request (used by the handlers for checks of their own)."""
    return _error(message)


@dataclass(frozen=True)
class Limits:
    max_side: int = 128          # height and width, pixels
    max_frames: int = 33
    max_steps: int = 50
    max_batch: int = 4
    max_configs: int = 6         # configurations in one Compare run (the sdpa reference included)
    max_prompt_chars: int = 500
    max_guidance: float = 20.0
    max_request_s: float | None = None   # refuse a request estimated to take longer (None: no bound)
    # Sampling steps the page starts with. At 4 steps the shipped clip models draw the asked digit in 0.82-0.88
    # of clips and 0.47-0.67 of stills, at 8 in 0.96 of clips (docs/RESULTS.md, text-to-video), so a CPU
    # starts at 8 too (a clip takes 4.5-7 s there). A prompt-mode still is one frame of a clip and has no
    # vote over frames: it starts at 16 steps (0.92-0.95 of stills against 0.89-0.91 at 8).
    default_steps: int = 8
    still_steps: int = 16

    @classmethod
    def for_device(cls, device, **overrides) -> "Limits":
        """Bounds for ``device``. On a CPU one denoising step of a 16x64x64 clip takes seconds and a
        128 px, 33-frame request took minutes at 2 steps, so a CPU gets 64 px, 17 frames, 20 steps,
        batch 2 and a 90 s bound per request; a GPU keeps the full bounds and a 120 s bound."""
        kind = getattr(device, "type", str(device))
        base = (dict(max_side=64, max_frames=17, max_steps=20, max_batch=2, max_request_s=90.0)
                if kind == "cpu" else dict(max_request_s=120.0))
        base.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**base)

    def describe(self) -> str:
        bound = f", about {self.max_request_s:.0f} s per request" if self.max_request_s else ""
        return (f"side ≤ {self.max_side} px, frames ≤ {self.max_frames}, steps ≤ {self.max_steps}, "
                f"batch ≤ {self.max_batch}, configurations ≤ {self.max_configs}{bound}")

    def side_range(self, stride: int) -> tuple[int, int]:
        """(smallest, largest) height or width a model with this patch stride can run: multiples of
        the stride up to max_side (the form offers exactly these)."""
        return stride, max(stride, self.max_side // stride * stride)


def bounded_int(name: str, value, low: int, high: int) -> int:
    """``value`` as an int within [low, high], else a readable ``gr.Error``."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise _error(f"{name}={value!r} is not allowed: {name} must be a whole number from {low} to {high}") from None
    if number != number or number in (float("inf"), float("-inf")) or number != int(number):
        raise _error(f"{name}={value!r} is not allowed: {name} must be a whole number from {low} to {high}")
    number = int(number)
    if not low <= number <= high:
        raise _error(f"{name}={number} is out of bounds: this server allows {name} from {low} to {high}")
    return number


def bounded_float(name: str, value, low: float, high: float) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise _error(f"{name}={value!r} is not allowed: {name} must be a number from {low:g} to {high:g}") from None
    if not low <= number <= high:
        raise _error(f"{name}={number:g} is out of bounds: this server allows {name} from {low:g} to {high:g}")
    return number


def bounded_prompt(prompt, limits: Limits, name: str = "prompt") -> str:
    prompt = "" if prompt is None else str(prompt)
    if len(prompt) > limits.max_prompt_chars:
        raise _error(f"{name} has {len(prompt)} characters; this server allows at most {limits.max_prompt_chars}")
    return prompt


def bounded_side(name: str, value, multiple: int, limits: Limits) -> int:
    """A height or width: a multiple of the model's patch stride within ``limits.side_range``."""
    low, high = limits.side_range(multiple)
    side = bounded_int(name, value, low, high)
    if side % multiple:
        raise _error(f"{name}={side} must be a multiple of {multiple} (the model's patch stride), "
                     f"e.g. {max(multiple, side - side % multiple)}")
    return side


class TimeBudget:
    """Estimated seconds of a request, from the rate this server measured on earlier ones.

    Work = steps x tokens x batch x (2 with guidance: two transformer passes a step); the rate is
    seconds of denoising per unit of work, kept per (family, attention) as the most recent
    measurement. Before any measurement there is no estimate and the request runs (its size is
    still bounded by ``Limits``)."""

    def __init__(self, max_seconds: float | None):
        self.max_seconds = max_seconds
        self._rates: dict = {}
        self._lock = threading.Lock()

    @staticmethod
    def work(steps: int, tokens: int, batch: int, guidance: float) -> float:
        return float(steps * tokens * batch * (2 if guidance > 1.0 else 1))

    def estimate(self, key, work: float) -> float | None:
        with self._lock:
            rate = self._rates.get(key)
        return None if rate is None else rate * work

    def check(self, key, work: float, steps: int) -> float | None:
        """The estimate in seconds (None before a measurement); refuses past ``max_seconds``."""
        est = self.estimate(key, work)
        if est is not None and self.max_seconds is not None and est > self.max_seconds:
            fewer = max(1, int(steps * self.max_seconds / est))
            raise _error(f"steps={steps}: this request would take about {est:.0f} s here, past this server's "
                         f"{self.max_seconds:.0f} s per request: use steps ≤ {fewer}, or fewer frames, a smaller "
                         f"size or batch")
        return est

    def record(self, key, work: float, seconds: float) -> None:
        if work > 0 and seconds > 0:
            with self._lock:
                self._rates[key] = seconds / work

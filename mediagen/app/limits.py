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

import collections
import logging
import statistics
import threading
from dataclasses import dataclass

from ..pipelines.names import START_STEPS

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
    # Sampling steps the page starts with (names.START_STEPS, as `mediagen generate`; a CPU too: a clip takes
    # 4.5-7 s there); class images start at the clips' steps.
    default_steps: int = START_STEPS["text-to-video"]
    still_steps: int = START_STEPS["text-to-image"]

    @classmethod
    def for_device(cls, device, served: dict | None = None, **overrides) -> "Limits":
        """Bounds for ``device``. On a CPU one denoising step of a 16x64x64 clip takes seconds and a
        128 px, 33-frame request took minutes at 2 steps, so a CPU gets 64 px, 17 frames, 20 steps,
        batch 2 and a 90 s bound per request, widened to ``served`` (the largest size the served video models
        trained at, {"frames", "height", "width"}: a model trained on long clips is offered at that size, the time
        bound deciding what runs); a GPU keeps the full bounds and a 120 s bound."""
        kind = getattr(device, "type", str(device))
        base = (dict(max_side=64, max_frames=17, max_steps=20, max_batch=2, max_request_s=90.0)
                if kind == "cpu" else dict(max_request_s=120.0))
        if kind == "cpu" and served:
            full = cls()
            side = max(served.get("height", 0), served.get("width", 0))
            base["max_side"] = min(full.max_side, max(base["max_side"], side))
            base["max_frames"] = min(full.max_frames, max(base["max_frames"], served.get("frames", 0)))
        base.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**base)

    def start_steps(self, still: bool) -> int:
        """The steps a task starts with, on the page and when an API call leaves steps out:
        ``still_steps`` for a prompt-mode still, else ``default_steps``; at most ``max_steps``."""
        return min(self.still_steps if still else self.default_steps, self.max_steps)

    def describe(self) -> str:
        bound = f", about {self.max_request_s:.0f} s per request" if self.max_request_s else ""
        return (f"side ≤ {self.max_side} px, frames ≤ {self.max_frames}, steps ≤ {self.max_steps}, "
                f"batch ≤ {self.max_batch}, configurations ≤ {self.max_configs}{bound}")

    def side_range(self, stride: int) -> tuple[int, int]:
        """(smallest, largest) height or width a model with this patch stride can run: multiples of
        the stride up to max_side (the form offers exactly these)."""
        return stride, max(stride, self.max_side // stride * stride)


def bounded_int(name: str, value, low: int, high: int) -> int:
    """``value`` as an int within [low, high], else a readable ``gr.Error``. A boolean is refused:
    Python counts True as 1, so ``steps=True`` would run one step without a word."""
    if isinstance(value, bool):
        raise _error(f"{name}={value!r} is not allowed: {name} must be a whole number from {low} to {high}")
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
    """``value`` as a float within [low, high], else a readable ``gr.Error`` (a boolean is refused, as in
    ``bounded_int``)."""
    if isinstance(value, bool):
        raise _error(f"{name}={value!r} is not allowed: {name} must be a number from {low:g} to {high:g}")
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
    """Estimated seconds of a request, from this server's own earlier requests of the same model.

    A request's time is modelled as

        seconds = fixed + steps x (per_pass + per_token x tokens)

    where tokens is what one transformer pass carries (grid tokens x batch, x 2 with guidance: the
    pipelines run the two guidance branches as one batch). ``fixed`` is everything outside the denoising
    steps (text encoding, the loop's set-up, decoding); ``per_pass`` is a pass's cost whatever its size
    (Python, launches, small kernels), which dominates a small request; ``per_token`` the cost that grows
    with the size. Keeping the three apart is what lets a tiny request and a large one share a model: a
    single rate per token, taken from a 2-token request whose step is all overhead, put the default clip
    at 20 times its real time.

    Fitting, per key (a model on this server's device), over its last ``HISTORY`` requests:
    - a request of two or more steps gives one step time, the median of its steps after the first (the
      first carries the loop's set-up and first-call work), and one fixed time, its whole time less its
      steps. A one-step request's only step carries that set-up too, which at a tiny size is most of
      it, so its times are used only while no longer request has been measured;
    - ``fixed`` is the lower median of the fixed times, and the step times of one size are reduced to
      their lower median, so that one slow request (another request sharing the cores, say) does not
      move the estimate;
    - with two or more sizes measured, per_pass + per_token x tokens is the Theil-Sen line through the
      sizes' step times (median of the pairwise slopes, then the median intercept; neither below 0);
    - with one size measured, how the cost grows with size is not known, and the estimate is a floor:
      a larger request costs at least that size's step time per step, a smaller one at least its share
      of it by tokens (true of every non-negative per_pass and per_token).
    A recorded time of the same model on a device of the same kind (``prior``: the shipped sampling-time data)
    is the estimate of a request of exactly its size until this server has run that size itself, so that a
    first long clip is estimated before it runs (a softmax clip of 8,192 tokens takes minutes on a CPU).
    Recorded sizes are not fitted into the line: the cost is not linear across them (softmax is quadratic in
    the tokens), so a line through them misplaces each one's own time. With neither there is no estimate and
    the request runs (its size is still bounded by ``Limits``)."""

    HISTORY = 32

    def __init__(self, max_seconds: float | None):
        self.max_seconds = max_seconds
        self._runs: dict = {}
        self._priors: dict = {}      # key -> {tokens per pass: seconds per step}, recorded elsewhere
        self._prior_source: dict = {}
        self._lock = threading.Lock()

    @staticmethod
    def tokens(grid_tokens: int, batch: int, guidance: float) -> int:
        """Tokens one transformer pass carries: the two guidance branches run as one batch."""
        return int(grid_tokens) * int(batch) * (2 if guidance > 1.0 else 1)

    def record(self, key, steps: int, tokens: int, seconds: float, step_seconds=()) -> None:
        """Add a measured request: ``seconds`` in all, ``step_seconds`` each denoising step's time (the
        first counted from the start of the denoising stage); without them its steps are taken as
        ``seconds`` spread evenly (nothing fixed)."""
        steps_timed = [float(s) for s in step_seconds if s is not None and s >= 0]
        if steps < 1 or tokens < 1 or not seconds > 0:
            return
        if len(steps_timed) >= 2:
            step = statistics.median(steps_timed[1:])
        elif steps_timed:
            step = steps_timed[0]
        else:
            step = seconds / steps
        fixed = max(0.0, seconds - steps * step)
        steady = len(steps_timed) >= 2
        with self._lock:
            runs = self._runs.setdefault(key, collections.deque(maxlen=self.HISTORY))
            runs.append((int(tokens), step, fixed, steady))

    def prior(self, key, steps: int, tokens: int, seconds: float, source: str) -> None:
        """Add a recorded request of ``key``'s model on a device like this one (``source`` says where it was
        recorded, for the refusal's wording): ``seconds`` in all, spread over its ``steps``."""
        if steps < 1 or tokens < 1 or not seconds > 0:
            return
        with self._lock:
            self._priors.setdefault(key, {})[int(tokens)] = seconds / steps
            self._prior_source[key] = source

    def model(self, key) -> dict | None:
        """The fitted terms of ``key`` (seconds): fixed, per_pass, per_token, and ``sizes``, the
        token counts measured; None before any measurement."""
        with self._lock:
            runs = list(self._runs.get(key, ()))
        if not runs:
            return None
        runs = [r for r in runs if r[3]] or runs      # one-step requests only while there is nothing else
        by_size: dict[int, list[float]] = {}
        for tokens, step, _, _ in runs:
            by_size.setdefault(tokens, []).append(step)
        sizes = sorted(by_size)
        step_at = {n: statistics.median_low(by_size[n]) for n in sizes}
        fixed = statistics.median_low([r[2] for r in runs])
        if len(sizes) == 1:
            return {"fixed": fixed, "per_pass": None, "per_token": None, "sizes": sizes, "step_at": step_at}
        slopes = [(step_at[b] - step_at[a]) / (b - a) for i, a in enumerate(sizes) for b in sizes[i + 1:]]
        per_token = max(0.0, statistics.median(slopes))
        per_pass = max(0.0, statistics.median([step_at[n] - per_token * n for n in sizes]))
        return {"fixed": fixed, "per_pass": per_pass, "per_token": per_token, "sizes": sizes, "step_at": step_at}

    def _recorded_step(self, key, tokens: int) -> float | None:
        """The recorded seconds per step of a request of exactly ``tokens`` per pass, while this server has not
        run that size itself; None otherwise."""
        with self._lock:
            step = self._priors.get(key, {}).get(int(tokens))
            ran = any(r[0] == int(tokens) for r in self._runs.get(key, ()))
        return None if ran else step

    def basis(self, key, tokens: int) -> str:
        """What the estimate of ``key`` at ``tokens`` per pass rests on, for a message."""
        if self._recorded_step(key, tokens) is None:
            return "this server's earlier requests"
        with self._lock:
            return self._prior_source.get(key, "recorded times")

    def step_estimate(self, key, tokens: int) -> tuple[float, float] | None:
        """(fixed seconds, seconds per step) of a request of ``tokens`` per pass; None before a measurement."""
        recorded = self._recorded_step(key, tokens)
        if recorded is not None:                     # the recorded time spreads its fixed part over the steps
            return 0.0, recorded
        m = self.model(key)
        if m is None:
            return None
        if m["per_token"] is None:                   # one size measured: a floor (see the class docstring)
            (size,) = m["sizes"]
            return m["fixed"], m["step_at"][size] * min(1.0, tokens / size)
        return m["fixed"], m["per_pass"] + m["per_token"] * tokens

    def estimate(self, key, steps: int, tokens: int) -> float | None:
        """Estimated seconds of a request of ``steps`` steps of ``tokens`` per pass (None before a measurement)."""
        got = self.step_estimate(key, tokens)
        return None if got is None else got[0] + steps * got[1]

    def steps_that_fit(self, fixed: float, per_step: float, steps: int) -> int:
        """The most steps whose estimate ``fixed + steps * per_step`` stays within ``max_seconds`` (``steps``
        when a step costs nothing; below 1 when even the fixed part is past)."""
        return int((self.max_seconds - fixed) // per_step) if per_step > 0 else steps

    def check(self, key, steps: int, tokens: int, instead=None) -> float | None:
        """The estimate in seconds (None before a measurement); refuses past ``max_seconds`` with the
        estimate and the steps that would fit, and what ``instead()`` (called only then) adds: another
        model that fits, say."""
        got = self.step_estimate(key, tokens)
        if got is None:
            return None
        fixed, per_step = got
        est = fixed + steps * per_step
        if self.max_seconds is not None and est > self.max_seconds:
            fit = self.steps_that_fit(fixed, per_step, steps)
            fewer = f"steps ≤ {fit}, or " if 1 <= fit < steps else ""
            raise _error(f"steps={steps}: this request would take about {est:.0f} s here (estimated from "
                         f"{self.basis(key, tokens)}), past this server's {self.max_seconds:.0f} s per request: use "
                         f"{fewer}fewer frames, a smaller size or batch{instead() if instead else ''}")
        return est

"""Bounds on what one request may ask for, checked before any work starts.

A value out of bounds raises ``gr.Error`` with a message naming the input, the value given and the
allowed range, so the browser (and ``gradio_client``) shows a sentence instead of a stack trace.
Sliders would make Gradio reject a value with its own nameless message; the app uses number
fields and these checks instead.
"""

from __future__ import annotations

from dataclasses import dataclass


def _error(message: str) -> Exception:
    """``gr.Error(message)``; gradio is imported on use, so ``mediagen --help`` stays quick."""
    import gradio as gr

    return gr.Error(message)


@dataclass(frozen=True)
class Limits:
    max_side: int = 128          # height and width, pixels
    max_frames: int = 33
    max_steps: int = 50
    max_batch: int = 4
    max_configs: int = 6         # configurations in one Compare run (the sdpa reference included)
    max_prompt_chars: int = 500
    max_guidance: float = 20.0

    def describe(self) -> str:
        return (f"side ≤ {self.max_side} px, frames ≤ {self.max_frames}, steps ≤ {self.max_steps}, "
                f"batch ≤ {self.max_batch}, configurations ≤ {self.max_configs}")


def bounded_int(name: str, value, low: int, high: int) -> int:
    """``value`` as an int within [low, high], else a readable ``gr.Error``."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise _error(f"{name} must be a whole number from {low} to {high}; got {value!r}") from None
    if number != int(number):
        raise _error(f"{name} must be a whole number from {low} to {high}; got {value!r}")
    number = int(number)
    if not low <= number <= high:
        raise _error(f"{name}={number} is out of bounds: this server allows {name} from {low} to {high}")
    return number


def bounded_float(name: str, value, low: float, high: float) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise _error(f"{name} must be a number from {low} to {high}; got {value!r}") from None
    if not low <= number <= high:
        raise _error(f"{name}={number:g} is out of bounds: this server allows {name} from {low:g} to {high:g}")
    return number


def bounded_prompt(prompt, limits: Limits) -> str:
    prompt = "" if prompt is None else str(prompt)
    if len(prompt) > limits.max_prompt_chars:
        raise _error(f"prompt has {len(prompt)} characters; this server allows at most {limits.max_prompt_chars}")
    return prompt


def bounded_side(name: str, value, multiple: int, limits: Limits) -> int:
    """A height or width: within [multiple, max_side] and a multiple of the model's patch stride."""
    side = bounded_int(name, value, multiple, limits.max_side)
    if side % multiple:
        raise _error(f"{name}={side} must be a multiple of {multiple} (the model's patch stride), "
                       f"e.g. {max(multiple, side - side % multiple)}")
    return side

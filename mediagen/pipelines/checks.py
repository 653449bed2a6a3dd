"""Input checks shared by the pipelines; each error names the parameter, the value and what is allowed."""

from __future__ import annotations

OUTPUT_TYPES = ("pil", "np", "pt", "latent")


def check_multiple(name: str, value, factor: int, why: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0 or value % factor:
        raise ValueError(f"{name}={value!r} is not allowed: it must be a positive multiple of {factor} ({why})")


def check_output_type(output_type: str) -> None:
    if output_type not in OUTPUT_TYPES:
        raise ValueError(f"output_type={output_type!r} is not allowed: use one of {OUTPUT_TYPES}")


def check_positive_int(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}={value!r} is not allowed: use an int >= 1")


def check_callback_inputs(names, allowed) -> None:
    bad = [n for n in (names or []) if n not in allowed]
    if bad:
        raise ValueError(f"callback_on_step_end_tensor_inputs has {bad}; allowed: {list(allowed)}")

"""What the benchmarks share: the markdown table writer (``mediagen.eval.tables``, passed on), the launch-setting
grids of the sweep options, the whole-model helpers of wan_model.py and dit_images.py. Repeated calls are timed by
``mediagen.eval.timing.measure`` everywhere, except the attention op's, which ``mediagen.eval.attention_bench``
times with triton's do_bench on a GPU (kernel time); the clocks left in a script (a training run's wall time, a
time budget, a section's or a job's elapsed time) each say why they are not ``measure``."""

from __future__ import annotations

import itertools

import torch

from mediagen.eval import tables

markdown_table = tables.markdown_table  # the one writer; the benchmarks import it from here


def settings_grid(specs: list[str]) -> list[dict]:
    """Every combination of ``FIELD=V1,V2,...`` specs as a dict of launch-setting fields, values read as ints,
    true / false or else strings: ``["BT=32,64", "lowp=true"]`` -> ``[{BT: 32, lowp: True}, {BT: 64, lowp: True}]``."""
    fields = {}
    for spec in specs:
        name, sep, values = spec.partition("=")
        if not sep or not name or not values:
            raise ValueError(f"setting {spec!r} is not allowed: write FIELD=V1,V2,... (e.g. warps=4,8)")
        fields[name] = [_value(v) for v in values.split(",")]
    return [dict(zip(fields, combo)) for combo in itertools.product(*fields.values())]


def _value(text: str):
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return int(text)
    except ValueError:
        return text


def label(fields: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in fields.items()) or "defaults"


def reset_compiler() -> None:
    """Forget compiled graphs and dynamo's counters (call between variants)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()


def graph_breaks() -> int:
    """Graph breaks dynamo has counted since the last ``reset_compiler()``."""
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values())


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


class ProjectionsOnly:
    """Attention processor that keeps a self-attention layer's projections and q/k norms and mixes no
    tokens (o = q + k + v, so that no projection is dead code under torch.compile): the floor for any
    attention that keeps the pretrained projections, as MHLA does. Serves diffusers' ``Attention``
    (DiT) and ``WanAttention``."""

    def __call__(self, attn, hidden_states, *args, **kwargs):
        q, k, v = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        if getattr(attn, "norm_q", None) is not None:
            q, k = attn.norm_q(q), attn.norm_k(k)
        return attn.to_out[1](attn.to_out[0](q + k + v))


def reset_self_attention(model, layers, stock_processor) -> None:
    """Every self-attention layer in ``layers`` back to a fresh ``stock_processor()`` and the model's record of
    its conversion dropped, so that the next variant builds every layer from scratch.

    ``mediagen.convert`` leaves a layer alone when its recorded attention and options already are the ones asked
    (that keeps trained weights), and it does not know processors set by hand (``NoSelfAttention``,
    ``ProjectionsOnly``), which are recorded as "sdpa". Without this reset a variant that follows one of them
    inherits its layers: "sdpa" after "no-self-attn" measured no attention at all."""
    from mediagen.models.converted import CONFIG_KEY

    for attn in layers:
        attn.set_processor(stock_processor())
    if model.config.get(CONFIG_KEY) is not None:
        model.register_to_config(**{CONFIG_KEY: None})

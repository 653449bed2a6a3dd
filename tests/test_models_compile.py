"""The MHLA processors trace without graph breaks when the kernel itself is one opaque op.

The kernel's own compile story (a registered custom op) belongs to the kernels; here a stand-in
with no data-dependent code replaces it, so any break found is in the processor, the grid hook or
the conversion.
"""

import torch
from models_fixtures import dit_inputs, sana_inputs, tiny_dit, tiny_sana, tiny_wan, wan_inputs

import mediagen
import mediagen.attention.mhla as attention_mhla


def opaque_mhla(q, k, v, mix, grid, blocks, *, normalize=True, eps=1e-6, feature_map=None, scale=None, backend=None,
                rope=None, cpe=None):
    assert cpe is None  # traced code adds the CPE after the op
    out = (q.relu() + k.relu() + v) * mix.sum()
    if rope is not None:  # the tables reach the op (Wan with rope="features")
        out = out + rope[0].sum() * rope[1].sum()
    return out


def graph_breaks(model, inputs):
    with torch.no_grad():
        return torch._dynamo.explain(model)(**inputs).graph_break_count


def test_processors_compile_without_graph_breaks(monkeypatch):
    monkeypatch.setattr(attention_mhla, "mhla", opaque_mhla)
    torch._dynamo.reset()
    wan = mediagen.convert(tiny_wan(num_layers=2), "wan-mhla-h", blocks=[1, 2, 2], rope="features", out_norm=True,
                           out_gate=True, cpe_kernel=3)
    assert graph_breaks(wan, wan_inputs()) == 0
    dit = mediagen.convert(tiny_dit(num_layers=2), ["mhla", "linear"])
    assert graph_breaks(dit, dit_inputs()) == 0
    sana = mediagen.convert(tiny_sana(num_layers=2), ["mhla", "linear"])
    assert graph_breaks(sana, sana_inputs()) == 0
    torch._dynamo.reset()

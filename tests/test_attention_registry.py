"""The attention registry is the one place an attention is added: a toy attention registered here, and
nowhere else, converts a tiny model, runs, saves and loads, is measured by the diagnostics, and is offered
by ``mediagen generate`` and the app where a checkpoint of it exists."""

import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from models_fixtures import dit_inputs, tiny_dit

import mediagen
from mediagen.models import attention_registry as registry
from mediagen.models import attention_spec, load_transformer
from mediagen.models.dense_attention import softmax_attention_matrix


@dataclass
class ToyOptions:
    """The toy's one option: softmax attention at a temperature."""

    toy_temperature: float = 1.0

    def __post_init__(self):
        if not isinstance(self.toy_temperature, (int, float)) or not self.toy_temperature > 0:
            raise ValueError(f"toy_temperature={self.toy_temperature!r} is not allowed: use a number > 0")


class ToyAttention(torch.nn.Module):
    """softmax(q k^T / (sqrt(D) * temperature)) v, times a learned gain (a weight of its own, saved with the model)."""

    def __init__(self, toy_temperature: float = 1.0):
        super().__init__()
        self.temperature = toy_temperature
        self.gain = torch.nn.Parameter(torch.ones(()))

    def forward(self, q, k, v, grid, rope=None):
        scale = q.shape[-1] ** -0.5 / self.temperature
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=scale)
        return o.transpose(1, 2) * self.gain


def toy_dense(module, q, k, grid=None, rope=None):
    return softmax_attention_matrix(q, k, scale=q.shape[-1] ** -0.5 / module.temperature)


TOY = registry.Attention("toy", options=ToyOptions, module=lambda: ToyAttention, dense=toy_dense)


@pytest.fixture
def toy():
    with registry.registered(TOY):
        yield TOY


def run(model, inputs):
    with torch.no_grad():
        return model(**inputs, return_dict=False)[0]


def cores(model):
    return [b.attn1.processor.core for b in model.transformer_blocks]


def test_a_toy_attention_converts_runs_and_round_trips(toy, tmp_path):
    assert "toy" in attention_spec.ATTENTION_CHOICES and "toy_temperature" in attention_spec.OPTION_NAMES
    model, inputs = tiny_dit(num_layers=2), dit_inputs()
    softmax = run(model, inputs)
    mediagen.convert(model, "toy")
    assert all(type(c) is ToyAttention for c in cores(model))
    # at temperature 1 and gain 1 the toy is softmax attention: the converted model computes what it did
    torch.testing.assert_close(run(model, inputs), softmax, rtol=1e-5, atol=1e-5)
    mediagen.convert(model, "toy", toy_temperature=4.0, reinit=True)
    with torch.no_grad():
        cores(model)[1].gain.fill_(0.5)
    hot = run(model, inputs)
    assert (hot - softmax).abs().max() > 1e-3
    model.save_pretrained(tmp_path / "toy")
    back = load_transformer(tmp_path / "toy")
    assert back.config.mediagen_attention["toy_temperature"] == 4.0 and cores(back)[1].gain.item() == 0.5
    torch.testing.assert_close(run(back, inputs), hot)
    with pytest.raises(ValueError, match=r"toy_temperature=-1 is not allowed"):
        mediagen.convert(tiny_dit(num_layers=1), "toy", toy_temperature=-1)


def test_the_diagnostics_measure_a_toy_layer(toy):
    from mediagen.eval.attention_maps import AttentionRecorder, attention_matrix

    model = mediagen.convert(tiny_dit(num_layers=2), ["sdpa", "toy"], toy_temperature=2.0)
    with AttentionRecorder(model) as rec, torch.no_grad():
        model(**dit_inputs(batch=1))
    stats = rec.stats()
    assert {s["kind"] for s in stats.values()} == {"softmax", "ToyAttention"}
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 16, 2, 8, generator=g) for _ in range(3))
    layer = ToyAttention(2.0)
    A = attention_matrix(layer, q, k)
    got = (A @ v.double().transpose(1, 2)).transpose(1, 2)
    torch.testing.assert_close(got.float(), layer(q, k, v, None), rtol=1e-5, atol=1e-6)


def test_the_command_line_and_the_app_offer_a_toy_attention(toy, tmp_path, monkeypatch, capsys):
    """Presets convert to it; a <family>-toy checkpoint makes it a shipped choice of the CLI and the app."""
    from mediagen.app.models import ModelCache, default_models
    from mediagen.cli import main
    from mediagen.pipelines.building import pipeline_around
    from mediagen.pipelines.schedulers import make_scheduler

    out = tmp_path / "digit.png"
    assert main(["generate", "--model", "dit-tiny", "--attention", "toy", "--class-label", "1", "--steps", "1",
                 "--out", str(out)]) == 0 and out.is_file()
    root = tmp_path / "checkpoints"
    model = mediagen.convert(tiny_dit(num_layers=2), "toy", toy_temperature=2.0)
    pipeline_around(model, make_scheduler("flow-euler"), "class-to-image").save_pretrained(str(root / "image-toy"))
    monkeypatch.setenv("MEDIAGEN_CHECKPOINTS", str(root))
    assert main(["generate", "--model", "image-toy", "--attention", "toy", "--class-label", "1", "--steps", "1",
                 "--out", str(out)]) == 0
    assert main(["generate", "--model", "image-toy", "--attention", "mhla", "--out", str(out)]) == 2
    assert "trained checkpoints exist for toy" in capsys.readouterr().err
    models = default_models(root)
    assert models.image.offered() == ["toy"]
    cache = ModelCache(models, device="cpu")
    assert cache.blocks_for("image", "toy", (4, 4)) is None
    served = cache.transformer("image", "toy", (4, 4))
    assert all(type(c) is ToyAttention and c.temperature == 2.0 for c in cores(served))


def test_registering_is_checked_and_undone():
    with registry.registered(TOY):
        pass
    assert "toy" not in attention_spec.ATTENTION_CHOICES and "toy_temperature" not in attention_spec.OPTION_NAMES
    with pytest.raises(ValueError, match="attention='toy' is not allowed"):
        mediagen.convert(tiny_dit(num_layers=1), "toy")
    with pytest.raises(ValueError, match=r"attention name 'mhla' is not allowed: use a new non-empty name"):
        registry.register(registry.Attention("mhla", module=lambda: ToyAttention))

    @dataclass
    class Clash:
        feature_map: str = "elu1"   # linear / MHLA's option of this name defaults to "relu"

    with pytest.raises(ValueError, match=r"option 'feature_map' of attention 'clash' defaults to 'elu1'"):
        registry.register(registry.Attention("clash", options=Clash, module=lambda: ToyAttention))

    @dataclass
    class NoDefault:
        width: int

    with pytest.raises(ValueError, match=r"option 'width' of attention 'bare' needs a default"):
        registry.register(registry.Attention("bare", options=NoDefault, module=lambda: ToyAttention))
    assert registry.names() == ("sdpa", "linear", "mhla")


def test_the_registry_loads_without_torch():
    code = ("import sys; from mediagen.models import attention_registry as r; assert 'torch' not in sys.modules; "
            "print(','.join(r.names())); print(','.join(e.name for e in r.entries() if e.blocks))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["sdpa,linear,mhla", "mhla"], out.stderr

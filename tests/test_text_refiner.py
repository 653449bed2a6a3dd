"""The text refiner (mediagen/models/text_refiner.py): a fresh one is the identity, padding (all-zero rows)
is masked and stays zero, it mixes tokens, it saves and loads with the model, the shipped video model takes
one unchanged, and `model.text_refiner_layers` trains one."""

import json

import pytest
import torch

from mediagen import add_text_refiner
from mediagen.models import TextRefiner, build_transformer, load_transformer, preset
from mediagen.models.converted import MHLADiTTransformer2DModel, MHLAWanTransformer3DModel
from mediagen.pipelines import build_pipeline
from mediagen.pipelines.shipping import shipped_checkpoint
from mediagen.training import train
from mediagen.training.checkpoint import list_checkpoints, read_model
from mediagen.training.config import ConfigError
from training_helpers import TINY_WAN, tiny_config


def tiny_wan(seed=0):
    torch.manual_seed(seed)
    return build_transformer("wan-tiny").eval()


def inputs(seed=1, tokens=10, real=6, dim=32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 1, 3, 8, 8, generator=g)
    t = torch.tensor([500, 100])
    text = torch.randn(2, tokens, dim, generator=g)
    text[:, real:] = 0       # padding, as the pipelines pass it
    return x, t, text


def run(model, x, t, text):
    with torch.no_grad():
        return model(x, t, text).sample


def perturb(refiner: TextRefiner, seed=2):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in refiner.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    return refiner


def test_a_fresh_refiner_is_the_identity():
    model, (x, t, text) = tiny_wan(), inputs()
    before = run(model, x, t, text)
    keys = set(model.state_dict())
    assert add_text_refiner(model) is model
    assert type(model) is MHLAWanTransformer3DModel
    assert model.config.mediagen_text_refiner == {"layers": 1, "heads": 1, "mlp_ratio": 2.0}
    assert torch.equal(run(model, x, t, text), before)
    # every existing weight keeps its key; only the refiner's are new
    new = set(model.state_dict()) - keys
    assert keys <= set(model.state_dict()) and new and all(k.startswith("text_refiner.") for k in new)
    assert torch.equal(model.text_refiner(text), text)


def test_a_trained_refiner_changes_real_tokens_and_keeps_padding_zero():
    model, (x, t, text) = tiny_wan(), inputs()
    before = run(model, x, t, text)
    add_text_refiner(model, layers=2)
    refiner = perturb(model.text_refiner)
    assert not torch.allclose(run(model, x, t, text), before, atol=1e-4)   # the hook is applied
    with torch.no_grad():
        out = refiner(text)
        assert (out[:, :6] - text[:, :6]).abs().amax(-1).min() > 1e-3          # every real token changes
        assert torch.equal(out[:, 6:], torch.zeros_like(out[:, 6:]))           # padding stays exactly zero
        # more padding changes no real token: padding is masked as a key
        longer = torch.cat([text, torch.zeros(2, 7, 32)], dim=1)
        assert torch.allclose(refiner(longer)[:, :10], out, rtol=1e-5, atol=1e-5)
        # a prompt of padding only (no real token) gives zeros, not NaN
        assert torch.equal(refiner(torch.zeros(1, 5, 32)), torch.zeros(1, 5, 32))


def test_the_refiner_mixes_tokens():
    refiner = perturb(TextRefiner(32, layers=1))
    text = inputs()[2]
    other = text.clone()
    other[:, 3] += torch.randn(32, generator=torch.Generator().manual_seed(5))   # not a constant: LayerNorm drops it
    with torch.no_grad():
        a, b = refiner(text), refiner(other)
    assert (a[:, 0] - b[:, 0]).abs().max() > 1e-3          # token 0 reads token 3
    assert torch.equal(a[:, 6:], b[:, 6:])


def test_bf16_autocast_and_compile():
    refiner = perturb(TextRefiner(64, layers=1, heads=2))
    text = torch.randn(2, 8, 64)
    text[0, 5:] = 0
    with torch.no_grad():
        eager = refiner(text)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            half = refiner(text)
        # fullgraph: no data-dependent Python control flow
        compiled = torch.compile(refiner, fullgraph=True, backend="aot_eager")(text)
    assert torch.isfinite(half).all() and torch.equal(half[0, 5:].float(), torch.zeros(3, 64))
    assert (half.float() - eager).norm() < 0.05 * eager.norm()
    assert torch.allclose(compiled, eager, atol=1e-5)


def test_save_and_load_round_trip(tmp_path):
    model, (x, t, text) = tiny_wan(), inputs()
    plain = tmp_path / "plain"
    model.save_pretrained(plain)
    add_text_refiner(model, layers=2, mlp_ratio=1.5)
    perturb(model.text_refiner)
    want = run(model, x, t, text)
    model.save_pretrained(tmp_path / "refined")
    config = json.loads((tmp_path / "refined" / "config.json").read_text())
    assert config["mediagen_text_refiner"] == {"layers": 2, "heads": 1, "mlp_ratio": 1.5}
    assert config["_class_name"] == "MHLAWanTransformer3DModel" and "quantization_config" in config
    for loaded in (load_transformer(tmp_path / "refined"),
                   MHLAWanTransformer3DModel.from_pretrained(tmp_path / "refined")):
        assert len(loaded.text_refiner.blocks) == 2
        assert torch.equal(run(loaded.eval(), x, t, text), want)
    # a model without a refiner saves no such key, as it saved before
    assert "mediagen_text_refiner" not in json.loads((plain / "config.json").read_text())
    converted = MHLAWanTransformer3DModel.from_pretrained(plain)
    assert not hasattr(converted, "text_refiner")
    converted.save_pretrained(tmp_path / "again")
    assert "mediagen_text_refiner" not in json.loads((tmp_path / "again" / "config.json").read_text())


def test_the_shipped_video_model_loads_unchanged_and_takes_a_refiner():
    folder = shipped_checkpoint("video-mhla")
    if folder is None:
        pytest.skip("the shipped checkpoint video-mhla is not here")
    assert "mediagen_text_refiner" not in json.loads((folder / "transformer" / "config.json").read_text())
    model = load_transformer(folder, "transformer").eval()
    assert not hasattr(model, "text_refiner")
    g = torch.Generator().manual_seed(0)
    x, t = torch.randn(1, 1, 4, 32, 32, generator=g), torch.tensor([700])
    text = torch.randn(1, 64, 384, generator=g)
    text[:, 12:] = 0
    before = run(model, x, t, text)
    add_text_refiner(model)
    assert model.config.mediagen_text_refiner == {"layers": 1, "heads": 6, "mlp_ratio": 2.0}
    assert torch.equal(run(model, x, t, text), before)


def test_training_adds_and_trains_a_refiner(tmp_path):
    base = tmp_path / "base"
    tiny_wan().save_pretrained(base)
    start = {k: v.clone() for k, v in load_transformer(base).state_dict().items()}
    pretrained = [a for a in TINY_WAN if not a.startswith("model.preset=")] + [f"model.pretrained={base}",
                                                                                 "finetune.mode=full"]
    out = tmp_path / "run"
    train(tiny_config(out, pretrained, "model.text_refiner_layers=1", "train.max_steps=2", "checkpoint.every=2",
                      f"data.cache_dir={tmp_path / 'cache'}"))
    state = read_model(list_checkpoints(out)[-1][1])
    refined = {k: v for k, v in state.items() if k.startswith("text_refiner.")}
    assert set(state) - set(refined) == set(start)
    block = "text_refiner.blocks.0."
    assert refined[block + "proj.weight"].abs().max() > 0 and refined[block + "fc2.weight"].abs().max() > 0
    fresh = TextRefiner(32).state_dict()
    assert not torch.equal(refined[block + "norm1.weight"], fresh["blocks.0.norm1.weight"])  # second step: gradient
    pipe = build_pipeline(str(out / "pipeline"))
    assert pipe.transformer.config.mediagen_text_refiner["layers"] == 1
    for k, v in refined.items():
        assert torch.equal(pipe.transformer.state_dict()[k].float(), v.float()), k
    # resuming from the saved folder: its refiner is kept; another block count is refused in one line
    with pytest.raises(ConfigError, match=r"^model\.text_refiner_layers=2 is not allowed: the model already has a "
                                          r"text refiner of 1 blocks"):
        train(tiny_config(tmp_path / "other", [a for a in pretrained if not a.startswith("model.pretrained=")],
                          f"model.pretrained={out / 'pipeline'}", "model.text_refiner_layers=2", "train.max_steps=1"))


def test_errors_are_one_line_naming_the_parameter(tmp_path):
    model = tiny_wan()
    for kwargs, match in (({"layers": 0}, r"^layers=0 is not allowed: use an int >= 1$"),
                          ({"heads": 5}, r"^heads=5 is not allowed: use an int >= 1 that divides the text width 32$"),
                          ({"mlp_ratio": 0}, r"^mlp_ratio=0 is not allowed: use a finite number > 0$")):
        with pytest.raises(ValueError, match=match):
            add_text_refiner(model, **kwargs)
    assert type(model).__name__ == "WanTransformer3DModel" and not hasattr(model, "text_refiner")  # left as it was
    with pytest.raises(ValueError, match=r"^layers=-1 is not allowed"):
        TextRefiner(32, layers=-1)
    add_text_refiner(model)
    with pytest.raises(ValueError, match=r"^the model already has a text refiner .*\)"):
        add_text_refiner(model)
    dit = build_transformer("dit-tiny")
    with pytest.raises(ValueError, match=r"^add_text_refiner\(\) takes a Wan transformer"):
        add_text_refiner(dit)
    with pytest.raises(ValueError, match=r"^mediagen_text_refiner=\{'layers': 1\} is not allowed for a "
                                         r"MHLADiTTransformer2DModel: only Wan models"):
        MHLADiTTransformer2DModel(**preset("dit-tiny")["config"], mediagen_text_refiner={"layers": 1})
    with pytest.raises(ConfigError, match=r"model\.text_refiner_layers=-1 is not allowed: use an int >= 0"):
        tiny_config(tmp_path / "r", TINY_WAN, "model.text_refiner_layers=-1")


def test_lora_refuses_to_add_a_refiner(tmp_path):
    base = tmp_path / "base"
    tiny_wan().save_pretrained(base)
    args = [a for a in TINY_WAN if not a.startswith("model.preset=")] + [f"model.pretrained={base}",
                                                                           "finetune.mode=lora"]
    with pytest.raises(ConfigError, match=r"^model\.text_refiner_layers=1 is not allowed with finetune\.mode=lora"):
        train(tiny_config(tmp_path / "run", args, "model.text_refiner_layers=1", "train.max_steps=1"))

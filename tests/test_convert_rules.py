"""mediagen.convert's rules: layers not named keep their processor, converting again keeps trained
weights (or is refused), options are checked at conversion, a saved model refuses plain diffusers."""

import json
import math
import subprocess
import sys
import types
import warnings

import pytest
import torch
from models_fixtures import dit_inputs, sana_inputs, tiny_dit, tiny_sana, tiny_wan, wan_inputs

import mediagen
from mediagen.models import load_transformer


def run(model, inputs):
    with torch.no_grad():
        return model(**inputs, return_dict=False)[0]


def procs(model):
    return [b.attn1.processor for b in getattr(model, "blocks", None) or model.transformer_blocks]


def convert_quiet(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # Wan's "no token positions" advice is not what these tests check
        return mediagen.convert(*args, **kwargs)


# --- layers not converted keep the processor they had ----------------------------------------------

def test_sana_hybrid_keeps_sanas_own_attention_in_the_other_layers(tmp_path):
    model, inputs = tiny_sana(num_layers=3), sana_inputs()
    before = run(model, inputs)
    native = procs(model)
    mediagen.convert(model, "linear", eps=1e-15, layers=[0])
    after = procs(model)
    assert type(after[0]).__name__ == "SanaMHLAProcessor"
    assert after[1] is native[1] and after[2] is native[2]          # SanaLinearAttnProcessor2_0, untouched
    torch.testing.assert_close(run(model, inputs), before, rtol=1e-4, atol=1e-5)
    assert model.config.mediagen_attention["layers"] == ["linear", None, None]
    model.save_pretrained(tmp_path)
    back = load_transformer(tmp_path).eval()
    assert [type(p).__name__ for p in procs(back)] == ["SanaMHLAProcessor", "SanaLinearAttnProcessor2_0",
                                                       "SanaLinearAttnProcessor2_0"]
    assert torch.equal(run(back, inputs), run(model, inputs))


def test_dit_layer_with_a_user_processor_keeps_it():
    from diffusers.models.attention_processor import AttnProcessor

    model = tiny_dit()
    mine = AttnProcessor()
    model.transformer_blocks[1].attn1.set_processor(mine)
    mediagen.convert(model, "mhla", layers=[0], blocks=[2, 2])
    assert procs(model)[1] is mine
    assert type(procs(model)[2]).__name__ == "AttnProcessor2_0"


# --- converting again ----------------------------------------------------------------------------

def _train(proc, value):
    with torch.no_grad():
        proc.core.mix.fill_(value)


def test_converting_twice_with_the_same_spec_keeps_trained_mc():
    model = mediagen.convert(tiny_dit(), "mhla", blocks=(2, 2))
    for p in procs(model):
        _train(p, 0.5)
    first = procs(model)
    mediagen.convert(model, "mhla", blocks=(2, 2))
    mediagen.convert(model, "mhla")                                   # options as before: the same spec
    assert procs(model) == first
    assert all(torch.all(p.core.mix == 0.5) for p in procs(model))


def test_a_different_spec_on_converted_layers_needs_reinit():
    model = mediagen.convert(tiny_dit(), "mhla", blocks=(2, 2))
    _train(procs(model)[0], 0.5)
    for kwargs in (dict(attention="mhla", blocks=(1, 2)), dict(attention="linear"), dict(attention="sdpa"),
                   dict(attention="mhla", out_norm=True)):
        with pytest.raises(ValueError, match=r"already converted.*reinit=True") as err:
            mediagen.convert(model, **kwargs)
        assert "layers [0, 1, 2]" in str(err.value)
    assert torch.all(procs(model)[0].core.mix == 0.5)                 # nothing changed by the refusals
    mediagen.convert(model, "mhla", blocks=(1, 2), reinit=True)
    assert procs(model)[0].core.mix.shape == (2, 2) and not torch.all(procs(model)[0].core.mix == 0.5)


def test_converting_again_after_the_processors_were_replaced_converts_them():
    """A converted model whose layers were given back the stock processor through diffusers
    (``set_attn_processor``) still has ``mhla`` in its config, but its layers hold no MHLA weights: converting
    again builds those layers afresh, as it would an unconverted layer (keeping the stock processor left the
    model running softmax under an "mhla" config; adding a CPE raised AttributeError)."""
    from diffusers.models.transformers.transformer_wan import WanAttnProcessor

    inputs = wan_inputs()
    fresh = run(convert_quiet(tiny_wan(), "mhla", blocks=(1, 2, 2), cpe_kernel=3), inputs)
    for kwargs in (dict(blocks=(1, 2, 2)), dict(cpe_kernel=3), dict(blocks=(1, 2, 2), cpe_kernel=3)):
        model = convert_quiet(tiny_wan(), "mhla", blocks=(1, 2, 2))
        model.set_attn_processor(WanAttnProcessor())                 # diffusers' way back to softmax
        convert_quiet(model, "mhla", **kwargs)
        assert [getattr(p, "kind", None) for p in procs(model)] == ["mhla"] * 3
        if kwargs.get("cpe_kernel"):
            assert torch.equal(run(model, inputs), fresh)           # the same as converting the plain model
    model = convert_quiet(tiny_wan(), "mhla", blocks=(1, 2, 2))
    model.set_attn_processor(WanAttnProcessor())
    convert_quiet(model, "linear")                                    # no trained weights to protect: no reinit
    assert [getattr(p, "kind", None) for p in procs(model)] == ["linear"] * 3


def test_later_conversions_keep_the_earlier_ones_and_round_trip(tmp_path):
    model = tiny_dit()
    inputs = dit_inputs()
    mediagen.convert(model, "mhla", layers=[0], blocks=(2, 2))
    _train(procs(model)[0], 0.5)
    kept = procs(model)[0]
    mediagen.convert(model, "linear", layers=[2])
    assert procs(model)[0] is kept and torch.all(kept.core.mix == 0.5)
    assert [getattr(p, "kind", None) for p in procs(model)] == ["mhla", None, "linear"]
    assert type(procs(model)[1]).__name__ == "AttnProcessor2_0"
    assert model.config.mediagen_attention["layers"] == ["mhla", None, "linear"]
    want = run(model, inputs)
    model.save_pretrained(tmp_path)
    back = load_transformer(tmp_path).eval()
    assert [getattr(p, "kind", None) for p in procs(back)] == ["mhla", None, "linear"]
    assert torch.all(procs(back)[0].core.mix == 0.5)
    assert torch.equal(run(back, inputs), want)


def test_new_options_cannot_change_layers_not_named():
    model = mediagen.convert(tiny_dit(), "mhla", layers=[0], blocks=(2, 2))
    with pytest.raises(ValueError, match=r"layers \[0\].*feature_map='relu' \(asked 'elu1'\)"):
        mediagen.convert(model, "linear", layers=[2], feature_map="elu1")
    with pytest.raises(ValueError, match=r"layers \[0\]"):               # reinit covers named layers only
        mediagen.convert(model, "linear", layers=[2], feature_map="elu1", reinit=True)
    mediagen.convert(model, "linear", layers=[0, 2], feature_map="elu1", reinit=True)
    assert [p.kind for p in (procs(model)[0], procs(model)[2])] == ["linear", "linear"]
    assert model.config.mediagen_attention["blocks"] is None           # no MHLA layer left


# --- a conversion that fails changes nothing --------------------------------------------------------

def _state(model):
    """What a failed conversion must leave as it was: class, processors (the objects), weights, config, hooks."""
    return (type(model), procs(model), {k: v.clone() for k, v in model.state_dict().items()}, dict(model.config),
            dict(model._forward_pre_hooks), getattr(model, "_mediagen_grids", None))


def _assert_unchanged(model, state):
    cls, processors, weights, config, hooks, grids = state
    assert type(model) is cls
    assert all(a is b for a, b in zip(procs(model), processors, strict=True))
    now = model.state_dict()
    assert now.keys() == weights.keys() and all(torch.equal(now[k], v) for k, v in weights.items())
    assert dict(model.config) == config
    assert dict(model._forward_pre_hooks) == hooks and getattr(model, "_mediagen_grids", None) is grids


def _fail_at_processor(monkeypatch, n):
    """Make building the n-th linear / MHLA processor (counting from 1) raise, as running out of memory would."""
    from mediagen.models.processors import GridSelfAttnProcessor

    init, built = GridSelfAttnProcessor.__init__, []

    def init_or_fail(self, *args, **kwargs):
        built.append(1)
        if len(built) == n:
            raise RuntimeError("out of memory")
        init(self, *args, **kwargs)

    monkeypatch.setattr(GridSelfAttnProcessor, "__init__", init_or_fail)


@pytest.mark.parametrize("converted_before", [False, True])
def test_a_conversion_that_fails_at_a_later_layer_leaves_the_model_as_it_was(converted_before, monkeypatch):
    """An error while converting layer 1 (after layer 0 got its new processor) gives back the original
    processors, weights, class and config: no half-converted model."""
    model, inputs = tiny_dit(), dit_inputs()
    if converted_before:
        mediagen.convert(model, "mhla", layers=[0, 2], blocks=(2, 2))
        _train(procs(model)[0], 0.5)
    want, state = run(model, inputs), _state(model)
    _fail_at_processor(monkeypatch, 2)
    with pytest.raises(RuntimeError, match="out of memory"):
        mediagen.convert(model, "linear", cpe_kernel=3, reinit=True)
    monkeypatch.undo()
    _assert_unchanged(model, state)
    assert torch.equal(run(model, inputs), want)
    mediagen.convert(model, "linear", cpe_kernel=3, reinit=True)      # and it converts as if nothing had happened
    assert [p.kind for p in procs(model)] == ["linear"] * 3


@pytest.mark.parametrize("failure", ["check", "build"])
def test_a_pipeline_whose_second_transformer_fails_keeps_both_as_they_were(failure, monkeypatch):
    """Its second transformer refused (head dim 8 is below the kernels' minimum) or failing while its layers
    are built: the first transformer, already converted by then, is given back as it was, and model_index too."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline

    second = tiny_wan(num_layers=2, seed=1, **(dict(num_attention_heads=4, attention_head_dim=8)
                                               if failure == "check" else {}))
    pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=FlowMatchEulerDiscreteScheduler(),
                       transformer=tiny_wan(num_layers=2), transformer_2=second)   # Wan 2.2's two experts
    states, index = [_state(pipe.transformer), _state(second)], dict(pipe.config)
    if failure == "build":
        _fail_at_processor(monkeypatch, 3)                           # the first layer of transformer_2
    with pytest.raises((ValueError, RuntimeError), match="head dim 8" if failure == "check" else "out of memory"):
        mediagen.convert(pipe, "mhla", grid=(3, 4, 4))
    for model, state in zip((pipe.transformer, pipe.transformer_2), states):
        _assert_unchanged(model, state)
    assert dict(pipe.config) == index


# --- what a converted model saves -------------------------------------------------------------------

def _put_back(family, model):
    """Give layers their original processor the diffusers way: every attention with set_attn_processor (Wan), one
    layer with set_processor (DiT's softmax; SANA's own ReLU linear attention, whose cross-attention is softmax)."""
    from diffusers.models.attention_processor import AttnProcessor2_0, SanaLinearAttnProcessor2_0
    from diffusers.models.transformers.transformer_wan import WanAttnProcessor

    if family == "wan":
        model.set_attn_processor(WanAttnProcessor())
    elif family == "dit":
        model.transformer_blocks[1].attn1.set_processor(AttnProcessor2_0())
    else:
        model.transformer_blocks[0].attn1.set_processor(SanaLinearAttnProcessor2_0())


@pytest.mark.parametrize("family", ["wan", "dit", "sana"])
def test_processors_put_back_with_diffusers_are_what_the_saved_model_loads(family, tmp_path):
    """After convert and diffusers' set_attn_processor / set_processor, the saved config records the processors
    the layers run (a converted layer given back softmax loads as softmax, SANA's own attention as SANA's own),
    so the folder loads as the model ran (recording the conversion would load fresh MHLA layers in their place)."""
    build, inputs = {"wan": (tiny_wan, wan_inputs), "dit": (tiny_dit, dit_inputs),
                     "sana": (tiny_sana, sana_inputs)}[family]
    model = convert_quiet(build(), "mhla", blocks=(1, 2, 2) if family == "wan" else (2, 2))
    for p in procs(model):
        _train(p, 0.5)
    _put_back(family, model)
    want = run(model, inputs())
    model.save_pretrained(tmp_path)
    back = load_transformer(tmp_path).eval()
    assert [type(p) for p in procs(back)] == [type(p) for p in procs(model)]
    assert all(torch.all(p.core.mix == 0.5) for p in procs(back) if hasattr(p, "core"))
    assert torch.equal(run(back, inputs()), want)
    assert model.config.mediagen_attention["layers"] == ["mhla"] * len(procs(model))   # the model itself unchanged


def test_a_linear_or_mhla_processor_in_a_layer_recorded_otherwise_cannot_be_saved(tmp_path):
    """Its options are not known, so it could not load as it runs; the refusal comes before anything is written."""
    model = mediagen.convert(tiny_dit(), ["mhla", "sdpa", "linear"], blocks=(2, 2))
    model.save_pretrained(tmp_path)
    saved = (tmp_path / "config.json").read_text()
    model.transformer_blocks[1].attn1.set_processor(procs(model)[0])
    with pytest.raises(ValueError, match=r"layer 1 runs a 'mhla' processor but config.mediagen_attention records "
                                         r"'sdpa'"):
        model.save_pretrained(tmp_path)
    assert (tmp_path / "config.json").read_text() == saved


# --- option checks at conversion ------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, words", [
    (dict(blocks=(2.5, 2)), ["blocks=(2.5, 2)", "positive ints"]),
    (dict(blocks=(2, 2), eps=-1.0), ["eps=-1.0", "> 0"]),
    (dict(blocks=(2, 2), eps=math.nan), ["eps=nan", "finite"]),
    (dict(blocks=(2, 2), normalize=False, scale=math.inf), ["scale=inf", "finite"]),
    (dict(blocks=(2, 2), normalize="yes"), ["normalize='yes'", "True or False"]),
    (dict(blocks=(2, 2), cpe_kernel=True), ["cpe_kernel=True", "odd int"]),
    (dict(blocks=(2, 2), grid=(4.5, 4)), ["grid=(4.5, 4)", "positive ints"]),
    (dict(blocks=(2, 2), layers=[]), ["layers=[]", "0 to 2"]),
    (dict(attention=[None, None, None]), ["names no layer"]),
])
def test_bad_options_are_refused_at_conversion(kwargs, words):
    model = tiny_dit()
    kwargs = dict(dict(attention="mhla"), **kwargs)
    with pytest.raises(ValueError) as err:
        mediagen.convert(model, **kwargs)
    for w in words:
        assert w in str(err.value)
    assert type(model).__name__ == "DiTTransformer2DModel"            # left unconverted


def test_unknown_option_names_the_allowed_ones():
    with pytest.raises(TypeError, match=r"\['block'\].*'feature_map', .*'blocks', 'per_head_mix'"):
        mediagen.convert(tiny_dit(), "mhla", block=(2, 2))


def test_head_dim_below_the_kernels_minimum_is_refused_at_conversion():
    model = tiny_dit(num_attention_heads=4, attention_head_dim=8)
    with pytest.raises(ValueError, match="layer 0 has head dim 8.*from 16 to 256"):
        mediagen.convert(model, "mhla", blocks=(2, 2))
    mediagen.convert(model, "sdpa")                                   # softmax layers take any head dim
    assert model.config.mediagen_attention["layers"] == ["sdpa"] * 3


# --- imports and names -----------------------------------------------------------------------------

def test_models_convert_is_the_function():
    import mediagen.models.convert  # noqa: F401  the submodule, imported first on purpose
    from mediagen.models import convert

    assert isinstance(convert, types.FunctionType) and convert is mediagen.convert
    from mediagen.models.convert import attention_spec_of  # the module still imports by its full name

    assert callable(attention_spec_of)


def test_attention_names_module_is_light_and_the_one_source_of_options():
    code = ("import sys; from mediagen.models.attention_spec import ATTENTION_CHOICES, OPTION_NAMES; "
            "assert 'torch' not in sys.modules; print(','.join(ATTENTION_CHOICES)); print(','.join(OPTION_NAMES))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    # the attentions' own options in registration order (linear's, then MHLA's), then the layer options
    assert out.stdout.split() == ["sdpa,linear,mhla,wan-mhla-h",
                                  "feature_map,normalize,eps,scale,feature_eps,blocks,per_head_mix,denominator,"
                                  "mix_init,out_norm,out_gate,cpe_kernel,rope,in_norm"], out.stderr


# --- plain diffusers refuses a saved converted model ----------------------------------------------

@pytest.mark.parametrize("family", ["wan", "dit", "sana"])
def test_plain_diffusers_class_refuses_a_converted_model(family, tmp_path):
    from diffusers import DiTTransformer2DModel, SanaTransformer2DModel, WanTransformer3DModel

    build, plain, inputs = {"wan": (tiny_wan, WanTransformer3DModel, wan_inputs),
                            "dit": (tiny_dit, DiTTransformer2DModel, dit_inputs),
                            "sana": (tiny_sana, SanaTransformer2DModel, sana_inputs)}[family]
    model = convert_quiet(build(), "linear")
    model.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"mediagen.*load_transformer\(path\)"):
        plain.from_pretrained(tmp_path)
    back = load_transformer(tmp_path).eval()
    assert "quantization_config" not in back.config
    assert torch.equal(run(back, inputs()), run(model, inputs()))
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["_class_name"] == type(model).__name__


def test_unconverted_model_saves_without_the_marker(tmp_path):
    model = tiny_dit()
    model.save_pretrained(tmp_path)
    assert "quantization_config" not in json.loads((tmp_path / "config.json").read_text())

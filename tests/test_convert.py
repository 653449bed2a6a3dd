"""mediagen.convert on tiny random Wan and DiT transformers: exactness, hybrids, round-trips, errors."""

import json
import os
import subprocess
import sys

import pytest
import torch
from mhla_oracle import mhla_dense
from models_fixtures import (capture_attn1, dit_inputs, dit_qkv, tiny_dit, tiny_wan, wan_inputs, wan_qkv)

import mediagen
from mediagen.kernels import mhla_reference
from mediagen.models import MHLADiTTransformer2DModel, MHLAWanTransformer3DModel, auto_blocks, load_transformer
from mediagen.models.processors import WanMHLAProcessor


def run(model, inputs):
    with torch.no_grad():
        return model(**inputs, return_dict=False)[0]


@pytest.mark.parametrize("family", ["wan", "dit"])
def test_sdpa_conversion_is_exact(family):
    model, inputs = (tiny_wan(), wan_inputs()) if family == "wan" else (tiny_dit(), dit_inputs())
    before = run(model, inputs)
    mediagen.convert(model, "sdpa")
    assert type(model).__name__.startswith("MHLA")
    assert torch.equal(run(model, inputs), before)
    # and back from mhla to sdpa (replacing converted layers is asked for explicitly)
    mediagen.convert(model, "mhla", blocks=[1, 2, 2] if family == "wan" else [2, 2])
    assert not torch.equal(run(model, inputs), before)
    mediagen.convert(model, "sdpa", reinit=True)
    assert torch.equal(run(model, inputs), before)


def _check_layers_match_reference(model, inputs, qkv_fn, grid, blocks, blocks_attr):
    records, handles = capture_attn1(model, blocks_attr)
    run(model, inputs)
    for h in handles:
        h.remove()
    assert len(records) == len(getattr(model, blocks_attr))
    for attn, x, out, _ in records:
        q, k, v = qkv_fn(attn, x)
        o = mhla_reference(q, k, v, attn.processor.core.mix, grid, blocks, feature_map="relu")
        expected = attn.to_out[0](o.flatten(2))
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.filterwarnings("ignore:linear / MHLA layers of a Wan model")   # rope="none" on purpose
def test_wan_mhla_layers_equal_reference_on_their_qkv():
    model = mediagen.convert(tiny_wan(), "mhla", blocks=[2, 2, 3], rope="none")   # the oracle has no rope
    with torch.no_grad():  # a non-uniform Mc, so a wrong block layout would show
        for attn in (b.attn1 for b in model.blocks):
            attn.processor.core.mix.uniform_(0, 1)
    _check_layers_match_reference(model, wan_inputs(frames=3, height=8, width=12), wan_qkv, (3, 4, 6),
                                  (2, 2, 3), "blocks")


def test_dit_mhla_layers_equal_reference_on_their_qkv():
    model = mediagen.convert(tiny_dit(), "mhla", blocks=[2, 3])
    with torch.no_grad():
        for attn in (b.attn1 for b in model.transformer_blocks):
            attn.processor.core.mix.uniform_(0, 1)
    _check_layers_match_reference(model, dit_inputs(), dit_qkv, (4, 4), (2, 3), "transformer_blocks")


def wan_rotary(x, cos, sin):
    """diffusers' Wan rotary embedding (transformer_wan.apply_rotary_emb), the oracle of the rotation:
    x (B, N, H, D), tables (1, N, 1, D); channel pairs (2i, 2i+1) rotate by angle i."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    c, s = cos[..., 0::2], sin[..., 1::2]
    return torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)


def test_rope_features_match_dense_oracle():
    """rope='features': numerator on rotated features, denominator un-rotated (official Wan code)."""
    model = mediagen.convert(tiny_wan(num_layers=1), "mhla", blocks=[1, 2, 2], rope="features")
    records, _ = capture_attn1(model, "blocks")
    run(model, wan_inputs(frames=3, height=8, width=8))
    attn, x, out, (cos, sin) = records[0]
    q, k, v = (t.double() for t in wan_qkv(attn, x))
    qf, kf = q.relu(), k.relu()
    qr, kr = wan_rotary(qf, cos.double(), sin.double()), wan_rotary(kf, cos.double(), sin.double())
    mix = attn.processor.core.mix
    num = mhla_dense(qr, kr, v, mix, (3, 4, 4), (1, 2, 2), normalize=False)
    den = mhla_dense(qf, kf, torch.ones_like(v), mix, (3, 4, 4), (1, 2, 2), normalize=False)
    expected = attn.to_out[0]((num / (den + 1e-6)).float().flatten(2))
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.filterwarnings("ignore:linear / MHLA layers of a Wan model")   # rope="none" on purpose
def test_grid_follows_batch_and_resolution():
    model = mediagen.convert(tiny_wan(num_layers=2), "mhla", blocks=[1, 2, 2], rope="none")   # as the oracle
    big = wan_inputs(batch=2, frames=3, height=8, width=12)
    small = wan_inputs(batch=1, frames=2, height=6, width=8, seed=5)
    out_big = run(model, big)
    out_small = run(model, small)
    one = {k: v[:1] for k, v in big.items()}
    torch.testing.assert_close(run(model, one), out_big[:1], rtol=1e-5, atol=1e-6)  # CFG-style batching
    records, _ = capture_attn1(model, "blocks")
    run(model, small)
    attn, x, out, _ = records[0]
    q, k, v = wan_qkv(attn, x)
    expected = attn.to_out[0](mhla_reference(q, k, v, attn.processor.core.mix, (2, 3, 4), (1, 2, 2),
                                             feature_map="relu").flatten(2))
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert out_small.shape == small["hidden_states"].shape


def test_gradient_checkpointing_recompute_uses_its_own_grid():
    """Backward of a call at one resolution, after a forward at another, recomputes with the right grid."""
    grads = []
    for checkpointing in (False, True):
        model = mediagen.convert(tiny_wan(num_layers=2), "mhla", blocks=[1, 2, 2]).train()
        if checkpointing:
            model.enable_gradient_checkpointing()
        a = wan_inputs(batch=1, frames=3, height=8, width=12)
        b = wan_inputs(batch=1, frames=2, height=6, width=8, seed=3)
        loss_a = model(**a).sample.square().mean()
        loss_b = model(**b).sample.square().mean()
        loss_a.backward()
        loss_b.backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-6)


def test_save_load_round_trip_with_every_option(tmp_path):
    model = mediagen.convert(tiny_wan(num_layers=3), ["mhla", "sdpa", "linear"], blocks=[1, 2, 2], out_norm=True,
                             out_gate=True, cpe_kernel=3, rope="features", per_head_mix=True, grid=(3, 4, 6))
    with torch.no_grad():  # move the new weights off their init so loading has to restore them
        for name, p in model.named_parameters():
            if ".processor." in name:
                p.add_(torch.rand_like(p) * 0.1)
    inputs = wan_inputs()
    before = run(model, inputs)
    model.save_pretrained(tmp_path)
    for loaded in (load_transformer(tmp_path), MHLAWanTransformer3DModel.from_pretrained(tmp_path)):
        assert isinstance(loaded, MHLAWanTransformer3DModel)
        kinds = [type(b.attn1.processor).__name__ for b in loaded.blocks]
        assert kinds == ["WanMHLAProcessor", "WanAttnProcessor", "WanMHLAProcessor"]
        assert torch.equal(run(loaded.eval(), inputs), before)


def test_dit_round_trip(tmp_path):
    model = mediagen.convert(tiny_dit(), "wan-mhla-h", cpe_kernel=3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".processor." in name:
                p.add_(torch.rand_like(p) * 0.1)
    before = run(model, dit_inputs())
    model.save_pretrained(tmp_path)
    loaded = load_transformer(tmp_path).eval()
    assert isinstance(loaded, MHLADiTTransformer2DModel)
    assert loaded.config.mediagen_attention["blocks"] == auto_blocks((4, 4))
    assert torch.equal(run(loaded, dit_inputs()), before)


def test_hybrids_convert_exactly_the_layers_asked():
    def kinds(model):
        return [getattr(b.attn1.processor, "kind", "sdpa") for b in model.blocks]

    model = mediagen.convert(tiny_wan(num_layers=6), "mhla", layers=[1, 4], blocks=[1, 2, 2])
    assert kinds(model) == ["sdpa", "mhla", "sdpa", "sdpa", "mhla", "sdpa"]
    mediagen.convert(model, "wan-mhla-h", blocks=[1, 2, 2])
    assert kinds(model) == ["sdpa", "mhla", "mhla", "sdpa", "mhla", "mhla"]
    mediagen.convert(model, ["linear", "sdpa", "mhla", "sdpa", "sdpa", "linear"], blocks=[1, 2, 2], reinit=True)
    assert kinds(model) == ["linear", "sdpa", "mhla", "sdpa", "sdpa", "linear"]
    assert all(type(b.attn2.processor).__name__ == "WanAttnProcessor" for b in model.blocks)  # cross-attn stock
    new = [n for n, _ in model.named_parameters() if ".processor." in n]
    assert new == ["blocks.0.attn1.processor.core.mix", "blocks.2.attn1.processor.core.mix",
                   "blocks.5.attn1.processor.core.mix"]


def test_diffusion_pipeline_loads_a_converted_pipeline_after_import_mediagen(tmp_path):
    """Diffusers takes a library that model_index.json names from sys.modules, importing none: after
    ``import mediagen`` alone (still light), ``DiffusionPipeline.from_pretrained`` finds the converted
    transformer and the pixel-space autoencoder, the text encoder's module is listed as well, and the
    usual import forms reach the same module objects."""
    from diffusers import DDIMScheduler, DiTPipeline

    from mediagen.models.identity_autoencoder import IdentityAutoencoder

    model = mediagen.convert(tiny_dit(), "mhla", blocks=[2, 2])
    DiTPipeline(transformer=model, vae=IdentityAutoencoder(latent_channels=model.config.in_channels),
                scheduler=DDIMScheduler()).save_pretrained(tmp_path)
    index = json.loads((tmp_path / "model_index.json").read_text())
    assert index["transformer"] == ["mediagen.models.converted", "MHLADiTTransformer2DModel"]
    code = f"""
import sys, mediagen
assert 'torch' not in sys.modules and 'diffusers' not in sys.modules
from diffusers import DiffusionPipeline
pipe = DiffusionPipeline.from_pretrained({str(tmp_path)!r})
assert type(pipe.transformer) is mediagen.MHLADiTTransformer2DModel, type(pipe.transformer)
assert type(pipe.vae).__name__ == 'IdentityAutoencoder'
import mediagen.models.converted as converted
import mediagen.models.identity_autoencoder
from mediagen.models import byte_text_encoder
from mediagen.models.converted import MHLAWanTransformer3DModel
assert converted is sys.modules['mediagen.models.converted'] is mediagen.models.converted
assert converted.MHLAWanTransformer3DModel is MHLAWanTransformer3DModel is mediagen.MHLAWanTransformer3DModel
assert mediagen.models.identity_autoencoder.IdentityAutoencoder is type(pipe.vae)
assert byte_text_encoder.ByteTextEncoder.__module__ == 'mediagen.models.byte_text_encoder'
# the text encoder's module (its package imports torch) is listed too, and every import form reaches it
assert 'mediagen.text.encoders' not in sys.modules
encoder = getattr(sys.modules['mediagen.text.encoders.encoder'], 'MediagenTextEncoder')   # as diffusers does
import mediagen.text.encoders.encoder as module
from mediagen.text.encoders import MediagenTextEncoder, load_text_encoder
assert encoder is module.MediagenTextEncoder is MediagenTextEncoder is mediagen.text.encoders.encoder.MediagenTextEncoder
assert sys.modules['mediagen.text.encoders'] is mediagen.text.encoders and type(module) is type(sys)
print('ok')
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def test_a_folder_of_another_family_names_the_class_to_load_it_with(tmp_path):
    """Diffusers builds any config with any class: a DiT folder through the Wan class failed inside
    ``__init__`` ("TypeError: 'int' object is not iterable"); it now refuses in one line naming the class."""
    mediagen.convert(tiny_dit(), "mhla", blocks=[2, 2]).save_pretrained(tmp_path / "dit")
    tiny_dit().save_pretrained(tmp_path / "plain-dit")
    mediagen.convert(tiny_wan(), "mhla", blocks=[1, 2, 2]).save_pretrained(tmp_path / "wan")
    with pytest.raises(ValueError, match=r"dit holds a MHLADiTTransformer2DModel .* MHLAWanTransformer3DModel cannot "
                                         r"load: use mediagen.MHLADiTTransformer2DModel.from_pretrained\(path\)"):
        MHLAWanTransformer3DModel.from_pretrained(tmp_path / "dit")
    with pytest.raises(ValueError, match=r"plain-dit holds a DiTTransformer2DModel .* use "
                                         r"diffusers.DiTTransformer2DModel.from_pretrained"):
        MHLAWanTransformer3DModel.from_pretrained(tmp_path / "plain-dit")
    with pytest.raises(ValueError, match=r"wan holds a MHLAWanTransformer3DModel .*load_transformer\(path\)"):
        MHLADiTTransformer2DModel.from_pretrained(tmp_path / "wan")
    # its own family loads, converted or plain
    assert type(MHLADiTTransformer2DModel.from_pretrained(tmp_path / "plain-dit")) is MHLADiTTransformer2DModel
    assert type(MHLAWanTransformer3DModel.from_pretrained(tmp_path / "wan")) is MHLAWanTransformer3DModel


def test_convert_a_pipeline_records_the_new_class():
    from mediagen.pipelines.building import build_pipeline

    pipe = build_pipeline("wan-tiny")
    mediagen.convert(pipe, "mhla", grid=(3, 4, 4))
    assert pipe.config.transformer == ("mediagen.models.converted", "MHLAWanTransformer3DModel")
    assert isinstance(pipe.transformer.blocks[0].attn1.processor, WanMHLAProcessor)


@pytest.mark.parametrize("kwargs, words", [
    (dict(attention="flash"), ["attention='flash'", "mhla", "sdpa"]),
    (dict(attention="mhla", layers=[0, 3], blocks=[1, 2, 2]), ["layers", "3", "0 to 2"]),
    (dict(attention="mhla", blocks=[1, 5, 2], grid=(3, 4, 4)), ["blocks[1]=5", "grid[1]=4"]),
    (dict(attention="mhla"), ["blocks=None", "grid"]),
    (dict(attention="mhla", blocks=[2, 2]), ["blocks", "3 counts"]),
    (dict(attention="mhla", blocks=[1, 2, 2], feature_map="gelu"), ["feature_map='gelu'", "relu"]),
    (dict(attention="mhla", blocks=[1, 2, 2], rope="post"), ["rope='post'", "features"]),
    (dict(attention=["mhla", "softmax", "sdpa"], blocks=[1, 2, 2]), ["attention[1]='softmax'"]),
    # neither a name nor a list of names: refused naming the parameter (was "TypeError: 'NoneType' object is
    # not iterable", or a bytes / dict value read as a list of its items)
    (dict(attention=None), ["attention=None", "'mhla'", "one per layer"]),
    (dict(attention=3), ["attention=3", "'mhla'", "one per layer"]),
    (dict(attention=b"mhla"), ["attention=b'mhla'", "'mhla'", "one per layer"]),
    (dict(attention={"mhla": 1}), ["attention={'mhla': 1}", "'mhla'", "one per layer"]),
])
def test_bad_conversion_input_names_the_parameter(kwargs, words):
    with pytest.raises(ValueError) as err:
        mediagen.convert(tiny_wan(), **kwargs)
    for w in words:
        assert w in str(err.value)


def test_blocks_that_do_not_fit_the_runtime_grid():
    model = mediagen.convert(tiny_wan(num_layers=1), "mhla", blocks=[3, 2, 2])
    # fewer frames than blocks[0]: MHLA runs on blocks fitted to the grid (2, 2, 2), see attention.mhla.fit_mix
    assert torch.isfinite(run(model, wan_inputs(frames=2))).all()
    with pytest.raises(ValueError, match="width=7 is not a multiple of the patch size 2"):
        run(model, wan_inputs(width=7))
    with pytest.raises(ValueError, match="not supported"):
        mediagen.convert(torch.nn.Linear(2, 2))


def test_auto_blocks_respects_m_squared_le_n():
    for grid in [(21, 30, 50), (16, 16), (14, 14), (3, 4, 4), (5,), (2, 3, 7)]:
        blocks = auto_blocks(grid)
        n = torch.tensor(grid).prod().item()
        m = torch.tensor(blocks).prod().item()
        assert m * m <= n and all(1 <= b <= g for b, g in zip(blocks, grid))
    assert auto_blocks((16, 16)) == [4, 4]
    assert auto_blocks((21, 30, 50)) == [4, 5, 8]


def test_import_mediagen_is_light():
    code = ("import sys, mediagen; assert 'torch' not in sys.modules and 'diffusers' not in sys.modules; "
            "assert 'convert' in dir(mediagen) or 'convert' in mediagen._EXPORTS; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr


def test_wan_mhla_without_positions_warns():
    import warnings

    with pytest.warns(UserWarning, match="see no token positions"):
        mediagen.convert(mediagen.models.build_transformer("wan-tiny"), "mhla", blocks=[1, 2, 2], rope="none")
    with pytest.warns(UserWarning, match="rope='features'"):
        mediagen.convert(mediagen.models.build_transformer("wan-tiny"), "wan-mhla-h", blocks=[1, 2, 2], rope="none")
    with warnings.catch_warnings():
        warnings.simplefilter("error")                      # positioned variants and softmax: no warning
        mediagen.convert(mediagen.models.build_transformer("wan-tiny"), "mhla", blocks=[1, 2, 2])   # rope default
        mediagen.convert(mediagen.models.build_transformer("wan-tiny"), "mhla", blocks=[1, 2, 2], rope="features")
        mediagen.convert(mediagen.models.build_transformer("wan-tiny"), "mhla", blocks=[1, 2, 2], cpe_kernel=3,
                         rope="none")
        mediagen.convert(mediagen.models.build_transformer("wan-tiny"), "sdpa")
        mediagen.convert(mediagen.models.build_transformer("dit-tiny"), "mhla", blocks=[2, 2])


def test_wan_keeps_its_rope_unless_asked_not_to(tmp_path):
    """Wan's RoPE is its only position signal: a conversion that does not name rope keeps it on the MHLA
    features (rope='features'), saved as such; rope='none' is kept when asked for, a later conversion
    keeps the earlier one's choice, and a DiT (no RoPE) stays at 'none'."""
    import warnings

    from mediagen.models.convert import attention_spec_of

    model = mediagen.convert(tiny_wan(num_layers=2), "mhla", blocks=[1, 2, 2])
    assert attention_spec_of(model).rope == "features"
    model.save_pretrained(tmp_path / "wan")
    assert json.loads((tmp_path / "wan" / "config.json").read_text())["mediagen_attention"]["rope"] == "features"
    assert attention_spec_of(mediagen.MHLAWanTransformer3DModel.from_pretrained(tmp_path / "wan")).rope == "features"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        blind = mediagen.convert(tiny_wan(num_layers=2), "mhla", blocks=[1, 2, 2], rope="none")
    assert attention_spec_of(blind).rope == "none"
    again = mediagen.convert(blind, "mhla", blocks=[1, 2, 2], cpe_kernel=3)   # adds a CPE, keeps rope='none'
    assert attention_spec_of(again).rope == "none"
    assert attention_spec_of(mediagen.convert(tiny_wan(), "wan-mhla-h", blocks=[1, 2, 2])).rope == "features"
    assert attention_spec_of(mediagen.convert(tiny_dit(), "mhla", blocks=[2, 2])).rope == "none"


def test_wan_mhla_without_rope_cannot_tell_positions_apart():
    """Wan has no position embedding: on a constant clip, tokens of one MHLA block get the same
    output unless RoPE reaches the features (the reason rope='features' is the recipe)."""
    import warnings

    inputs = dict(wan_inputs(batch=1), hidden_states=torch.zeros(1, 1, 3, 8, 12))

    def output(rope):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = mediagen.convert(tiny_wan(), "mhla", blocks=[1, 2, 2], rope=rope)
        return run(model, inputs)[0, 0]                       # (F, H, W); patch 2x2, grid 3x4x6

    # tokens (0, 0, 0) and (0, 0, 1) share block 0: their pixels are [0:2, 0:2] and [0:2, 2:4]
    blind, rotated = output("none"), output("features")
    torch.testing.assert_close(blind[0, 0:2, 0:2], blind[0, 0:2, 2:4], rtol=1e-6, atol=1e-6)
    assert (rotated[0, 0:2, 0:2] - rotated[0, 0:2, 2:4]).abs().max() > 1e-3


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_wan_rope_tables_are_contiguous_fp32_angles(dtype):
    """The processor hands the kernels unit-stride fp32 (N, D/2) tables: pair j of token t gets
    cos[t, 2j] and sin[t, 2j + 1] of diffusers' interleaved (1, N, 1, D) tables."""
    from mediagen.models.processors import wan_rope_tables

    angle = torch.rand(7, 4, dtype=torch.float64) * 6
    cos = angle.cos().repeat_interleave(2, -1)[None, :, None].to(dtype)
    sin = angle.sin().repeat_interleave(2, -1)[None, :, None].to(dtype)
    c, s = wan_rope_tables((cos, sin))
    assert c.shape == s.shape == (7, 4) and c.dtype == s.dtype == torch.float32
    assert c.is_contiguous() and s.is_contiguous()
    torch.testing.assert_close(c, angle.cos().to(dtype).float())
    torch.testing.assert_close(s, angle.sin().to(dtype).float())
    with pytest.raises(ValueError, match=r"\(1, N, 1, D\)"):
        wan_rope_tables((cos[0], sin[0]))


def test_wan_rope_tables_are_converted_once_per_forward():
    """Every layer of a forward gets the same rotary tensors: the second layer reuses the first one's tables;
    other tensors, or the same ones changed in place, are converted again."""
    from mediagen.models.processors import wan_rope_tables

    angle = torch.rand(5, 4, dtype=torch.float64) * 6
    cos = angle.cos().repeat_interleave(2, -1)[None, :, None]
    sin = angle.sin().repeat_interleave(2, -1)[None, :, None]
    first = wan_rope_tables((cos, sin))
    assert all(a is b for a, b in zip(wan_rope_tables((cos, sin)), first))
    cos.mul_(-1)  # changed in place: converted again
    again = wan_rope_tables((cos, sin))
    torch.testing.assert_close(again[0], -first[0])
    other = wan_rope_tables((cos.clone(), sin.clone()))
    assert other[0] is not again[0] and torch.equal(other[0], again[0])


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("kernel", [[3, 1, 1], [1, 5, 1], [1, 1, 3], [7, 1, 1], 1, [3, 3, 3], 3])
def test_cpe_matches_the_depthwise_conv_of_the_token_grid(kernel, traced, monkeypatch):
    """The CPE adds, per channel, the depthwise conv of v over the token grid (zero past the ends)
    plus a bias: one-axis kernels as a sum of shifted copies in the token layout (in place eager,
    from a padded copy when traced), others through the conv, on a CPU on the tokens viewed channels-last
    (no copy: oneDNN's fast layout; on a GPU a contiguous channels-first copy, cuDNN's). The oracle is
    F.conv3d with the module's own weights on the channels-first grid."""
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: traced)
    grid = (3, 4, 6)
    model = mediagen.convert(tiny_wan(), "mhla", blocks=[1, 2, 2], cpe_kernel=kernel, rope="features", grid=grid)
    proc = model.blocks[0].attn1.processor
    with torch.no_grad():
        proc.cpe.weight.normal_()
        proc.cpe.bias.normal_()
    seen = []
    proc.cpe.register_forward_pre_hook(
        lambda m, args: seen.append(args[0].is_contiguous(memory_format=torch.channels_last_3d)))
    C = proc.cpe.in_channels
    v = torch.randn(2, 3 * 4 * 6, C, dtype=torch.float64, requires_grad=True)
    proc.double()
    got = proc._cpe(v, grid)
    x = v.transpose(1, 2).reshape(2, C, *grid)
    k = tuple(proc.cpe.kernel_size)  # [7, 1, 1] is longer than its axis (3): taps past both ends add nothing
    want = torch.nn.functional.conv3d(x, proc.cpe.weight, proc.cpe.bias, padding=tuple(a // 2 for a in k), groups=C)
    want = want.flatten(2).transpose(1, 2)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    # and the same gradients for the tokens, the weights and the bias (training goes through it)
    g = torch.randn_like(got)
    params = (v, proc.cpe.weight, proc.cpe.bias)
    for a, b in zip(torch.autograd.grad(got, params, g), torch.autograd.grad(want, params, g)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    axes_with_taps = sum(a > 1 for a in k)
    assert seen == ([] if axes_with_taps <= 1 else [True])


def test_temporal_cpe_is_a_shifted_sum_along_time():
    """cpe_kernel=[3, 1, 1] adds w[-1] v[t-1] + w[0] v[t] + w[1] v[t+1] + b per channel."""
    model = mediagen.convert(tiny_wan(), "mhla", blocks=[1, 2, 2], cpe_kernel=[3, 1, 1], rope="features",
                             grid=(3, 4, 6))
    proc = model.blocks[0].attn1.processor
    with torch.no_grad():
        proc.cpe.weight.normal_()
        proc.cpe.bias.normal_()
    grid = (3, 4, 6)
    v = torch.randn(2, 3 * 4 * 6, proc.cpe.in_channels)
    got = proc._cpe(v, grid)
    x = v.reshape(2, *grid, -1)
    w, b = proc.cpe.weight[:, 0, :, 0, 0], proc.cpe.bias  # (C, 3), (C,)
    want = torch.stack([x[:, t] * w[:, 1] + b + (x[:, t - 1] * w[:, 0] if t > 0 else 0)
                        + (x[:, t + 1] * w[:, 2] if t < 2 else 0) for t in range(3)], 1)
    torch.testing.assert_close(got, want.reshape(2, -1, x.shape[-1]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cpe, words", [([3, 2, 1], "one odd int per grid axis"), ([1, 1, 1], "one odd int per"),
                                        ([3, 1], "must have 3 sizes"), (4, "odd int")])
def test_bad_cpe_kernels_are_refused_before_the_model_changes(cpe, words):
    model = tiny_wan()
    with pytest.raises(ValueError, match=words):
        mediagen.convert(model, "mhla", blocks=[1, 2, 2], cpe_kernel=cpe, rope="features")
    assert type(model).__name__ == "WanTransformer3DModel"


def test_adding_a_cpe_keeps_the_trained_weights_and_the_output():
    model = mediagen.convert(tiny_wan(), "mhla", blocks=[1, 2, 2], rope="features", out_norm=True, grid=(3, 4, 6))
    with torch.no_grad():  # "trained" processor weights, off their init
        for name, p in model.named_parameters():
            if ".processor." in name:
                p.add_(torch.rand_like(p) * 0.1)
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    inputs = wan_inputs()
    before = run(model, inputs)
    mediagen.convert(model, "mhla", cpe_kernel=[3, 1, 1])
    assert model.config.mediagen_attention["cpe_kernel"] == [3, 1, 1]
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in trained.items())
    new = sorted(set(state) - set(trained))
    assert new and all(".processor.cpe." in k for k in new) and all(not state[k].any() for k in new)
    assert torch.equal(run(model, inputs), before)
    # anything beyond adding the CPE still asks for reinit
    with pytest.raises(ValueError, match="reinit=True"):
        mediagen.convert(model, "mhla", cpe_kernel=[3, 1, 1], out_norm=False)


def test_dit_processor_divides_by_the_layers_rescale_factor():
    """DiT's attention output is divided by ``rescale_output_factor`` (diffusers' rule), skipped only at 1."""
    model = mediagen.convert(tiny_dit(), "mhla", blocks=[2, 2])
    attn = model.transformer_blocks[0].attn1
    x = torch.randn(2, 16, attn.inner_dim)
    with torch.no_grad():
        model(**dit_inputs(), return_dict=False)  # the pre-hook records the latent grid
        one = attn(x)
        attn.rescale_output_factor = 2.0
        two = attn(x)
    torch.testing.assert_close(two, one / 2)
    assert one.abs().max() > 0

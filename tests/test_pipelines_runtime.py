"""The denoising loop's runtime (``pipe.set_runtime``, ``mediagen generate --runtime``): compiled
output equals eager output on the tiny presets, with softmax and MHLA attention; eager again calls
the plain module; bad values and CUDA graphs off a GPU are refused in one line.

On a CPU, torch.compile's first call builds C++ kernels (tens of seconds with a cold cache on a busy
2-core machine, a few seconds once Inductor's on-disk cache holds them). MHLA's CPU path (the
reference) compiles in pieces: its block bookkeeping depends on data and breaks the graph, which
changes nothing in the output. The CUDA-graph test runs where a GPU is visible.
"""

import pytest
import torch
from models_fixtures import tiny_dit, tiny_wan
from torch._dynamo.utils import counters

import mediagen
import mediagen.pipelines.runtime as runtime_module
from mediagen.cli import main
from mediagen.kernels.mhla import autograd as op_autograd, launches as op_launches, layout
from mediagen.models import IdentityAutoencoder
from mediagen.pipelines import (RUNTIMES, ClassConditionalImagePipeline, TextToImagePipeline, TextToVideoPipeline,
                                make_scheduler)

ON_GPU = torch.cuda.is_available()
# fp32 on a CPU: Inductor reorders sums, so a few steps differ by ~1e-6. bf16: Inductor keeps fused norms and
# activations in fp32 where eager rounds each op to bf16; after 3 steps latents of size ~2 differed from eager by
# up to 0.042 (DiT, MHLA) and 0.036 (Wan, sdpa) on the H200. A replay that hands back overwritten memory is off
# by O(1).
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 6e-2}


def gen(seed, device="cpu"):
    return torch.Generator(device=device).manual_seed(seed)


def placed(pipe, device, dtype):
    pipe.to(device)
    return pipe.to(dtype=dtype) if dtype != torch.float32 else pipe


def dit_pipe(attention, device="cpu", dtype=torch.float32):
    model = tiny_dit(num_layers=2)
    if attention != "sdpa":
        mediagen.convert(model, attention)
    pipe = ClassConditionalImagePipeline(model, make_scheduler("flow-euler"), IdentityAutoencoder(latent_channels=1))
    pipe.set_progress_bar_config(disable=True)
    return placed(pipe, device, dtype)


def wan_pipe(attention, device="cpu", dtype=torch.float32):
    model = tiny_wan(num_layers=2)
    if attention != "sdpa":
        mediagen.convert(model, attention, blocks=[1, 2, 2], rope="features")
    # flow-unipc keeps earlier steps' outputs: a runtime that hands back reused memory would show here
    pipe = TextToVideoPipeline(model, make_scheduler("flow-unipc"), IdentityAutoencoder(latent_channels=1))
    pipe.set_progress_bar_config(disable=True)
    return placed(pipe, device, dtype)


def draw(pipe, device="cpu"):
    """Latents after 3 guided steps from fixed noise (and fixed text states for the text model)."""
    if isinstance(pipe, ClassConditionalImagePipeline):
        return pipe([1, 7], num_inference_steps=3, guidance_scale=4.0, output_type="latent",
                    generator=gen(0, device)).images
    text = torch.randn(1, 5, 32, generator=gen(2)).to(device)
    return pipe(prompt_embeds=text, height=8, width=8, num_frames=3, num_inference_steps=3, guidance_scale=4.0,
                output_type="latent", generator=gen(0, device)).frames


def graphs_compiled() -> int:
    return counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("family,attention", [("dit", "sdpa"), ("dit", "mhla"), ("wan", "sdpa"), ("wan", "mhla")])
def test_compiled_loop_matches_eager_and_eager_again_is_the_plain_module(family, attention):
    torch._dynamo.reset()
    pipe = (dit_pipe if family == "dit" else wan_pipe)(attention)
    module = pipe.transformer
    eager = draw(pipe)
    assert pipe.runtime == "eager"

    before = graphs_compiled()
    assert pipe.set_runtime("compile") is pipe and pipe.runtime == "compile"
    compiled = draw(pipe)
    assert graphs_compiled() > before                    # the loop really ran compiled code
    assert pipe.transformer is module                    # the component itself is not wrapped
    torch.testing.assert_close(compiled, eager, atol=TOLERANCE[torch.float32], rtol=0)
    assert torch.equal(draw(pipe), compiled)             # a second run reuses the compiled code

    seen = graphs_compiled()
    pipe.set_runtime("eager")
    assert torch.equal(draw(pipe), eager)                # the plain module again, bit for bit
    assert graphs_compiled() == seen
    assert pipe.transformer is module and type(module).__name__ != "OptimizedModule"
    torch._dynamo.reset()


def test_every_pipeline_has_the_switch_and_checks_the_value():
    pipe = dit_pipe("sdpa")
    assert RUNTIMES == ("eager", "compile", "cuda-graphs")
    assert hasattr(TextToImagePipeline, "set_runtime") and hasattr(TextToVideoPipeline, "set_runtime")
    for bad in ("fast", "Compile", None, 1):
        with pytest.raises(ValueError) as err:
            pipe.set_runtime(bad)
        assert str(err.value) == f"runtime={bad!r} is not allowed: use one of ('eager', 'compile', 'cuda-graphs')"
    assert pipe.runtime == "eager"                       # a refused value changes nothing


def test_cuda_graphs_off_a_gpu_is_refused_in_one_line():
    pipe = dit_pipe("sdpa")                              # on the CPU
    with pytest.raises(ValueError) as err:
        pipe.set_runtime("cuda-graphs")
    message = str(err.value)
    assert "\n" not in message
    assert message == ("runtime='cuda-graphs' is not allowed on device cpu: CUDA graphs need a CUDA device; "
                       "use 'compile' or 'eager' there")
    assert pipe.runtime == "eager"


def test_generate_runtime_flag_reaches_the_loop(tmp_path, capsys, monkeypatch):
    # torch.compile stands in as the identity here, recording its mode: the loop then runs the plain
    # module through the compiled path (the real compile is tested above)
    modes = []
    monkeypatch.setattr(runtime_module.torch, "compile", lambda module, mode: modes.append(mode) or module)
    out = tmp_path / "digit.png"
    assert main(["generate", "--model", "dit-tiny", "--class-label", "3", "--steps", "2", "--runtime", "compile",
                 "--device", "cpu", "--out", str(out)]) == 0
    assert modes == ["default"] and out.is_file()
    modes.clear()
    assert main(["generate", "--model", "dit-tiny", "--class-label", "3", "--steps", "2", "--device", "cpu",
                 "--out", str(out)]) == 0
    assert modes == []                                   # eager by default
    capsys.readouterr()

    assert main(["generate", "--model", "dit-tiny", "--runtime", "cuda-graphs", "--device", "cpu",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("mediagen generate: error: --runtime cuda-graphs is not allowed with --device cpu: CUDA graphs "
                   "need --device cuda; use --runtime compile or eager")
    with pytest.raises(SystemExit) as exit_:
        main(["generate", "--model", "dit-tiny", "--runtime", "fast", "--out", str(out)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]   # argparse's line (its quoting varies by Python)
    assert "argument --runtime: invalid choice: 'fast' (choose from" in err
    assert all(name in err for name in RUNTIMES)


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("family,attention", [("dit", "mhla"), ("wan", "mhla"), ("wan", "sdpa")])
def test_cuda_graphs_and_compile_match_eager_in_bf16_on_a_gpu(family, attention, monkeypatch):
    torch._dynamo.reset()
    pipe = (dit_pipe if family == "dit" else wan_pipe)(attention, device="cuda", dtype=torch.bfloat16)
    eager = draw(pipe, "cuda")
    close = dict(atol=TOLERANCE[torch.bfloat16], rtol=0)
    for runtime in ("compile", "cuda-graphs"):
        # each runtime starts with the MHLA op's caches empty, as in a fresh process that samples compiled
        # from its first call: the index tensors the plans keep are then made inside the compiled run
        monkeypatch.setattr(op_autograd, "_plans", {})
        monkeypatch.setattr(op_launches, "_blk_cache", {})
        monkeypatch.setattr(layout, "_device_cache", {})
        pipe.set_runtime(runtime)
        # CUDA graphs: a run's first step warms up, the second records, the rest replay; a second run
        # replays throughout (an output overwritten by the next replay would show as a large error)
        for _ in range(2):
            torch.testing.assert_close(draw(pipe, "cuda"), eager, **close)
    pipe.set_runtime("eager")
    torch.testing.assert_close(draw(pipe, "cuda"), eager, **close)
    pipe.set_runtime("cuda-graphs")
    pipe.to("cpu")                                       # moved off the GPU after choosing CUDA graphs
    with pytest.raises(ValueError, match="runtime='cuda-graphs' is not allowed on device cpu"):
        draw(pipe)
    torch._dynamo.reset()


# --- the app: a runtime choice on the Image and Video tabs ---------------------------------------------

def test_app_runtime_reaches_the_loop_and_bad_values_are_refused(tmp_path, monkeypatch):
    gr = pytest.importorskip("gradio")
    from mediagen.app.handlers import MediagenApp
    from mediagen.app.limits import Limits
    from mediagen.app.models import ModelSet, ModelSource

    models = ModelSet(image=ModelSource("dit-tiny", untrained=("sdpa",)),
                      video=ModelSource("wan-tiny", untrained=("sdpa",), size={"frames": 3, "height": 8, "width": 8}),
                      text_encoders={"FlashAttention": "minilm"})             # refused before it would load
    app = MediagenApp(models, Limits(max_side=32, max_frames=5, max_steps=4, max_batch=2), device="cpu",
                      output_dir=tmp_path / "out")
    assert app.runtimes() == ["eager"]  # compile does not pay on a CPU; CUDA graphs need a GPU
    quiet = lambda *args, **kwargs: None                      # noqa: E731  (stands in for gr.Progress)
    request = ("class", 3, "", "", "sdpa", "FlashAttention", 1, 0, 2, 4.0, 8, 8)
    with pytest.raises(gr.Error, match="runtime='compile' is not offered on this server"):
        app.image(*request, "compile", progress=quiet)

    # as a GPU server offers them (torch.compile stubbed): a compiled request reaches the sampling loop
    monkeypatch.setattr(app, "runtimes", lambda: ["eager", "compile"])
    modes = []
    monkeypatch.setattr(runtime_module.torch, "compile", lambda module, mode: modes.append(mode) or module)
    _, _, timings, _ = app.image(*request, "compile", progress=quiet)
    assert modes == ["default"] and timings["denoising_ms"] > 0
    assert app.estimate("image", "sdpa", 64, 1, 2, 4.0) is None   # a compiled run may include compiling
    app.image(*request, progress=quiet)                             # eager by default
    assert modes == ["default"] and app.estimate("image", "sdpa", 64, 1, 2, 4.0) is not None

    with pytest.raises(gr.Error) as err:
        app.image(*request, "fast", progress=quiet)
    assert err.value.message == "runtime='fast' is not allowed: choose one of ['eager', 'compile', 'cuda-graphs']"
    with pytest.raises(gr.Error) as err:
        app.video("x", "", "sdpa", "FlashAttention", 3, 8, 8, 1, 0, 2, 4.0, "cuda-graphs", progress=quiet)
    assert err.value.message == ("runtime='cuda-graphs' is not offered on this server (cpu): CUDA graphs need a CUDA "
                                 "device; use one of ['eager', 'compile']")
    assert modes == ["default"]

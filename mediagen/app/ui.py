"""The page: tabs Image, Video, Compare and Benchmarks, each wired to one API endpoint of
``MediagenApp`` (api names: generate_image, generate_video, compare, benchmarks).

Choices follow the models: an attention is listed for a family only when the app offers it
(``models.py``: trained checkpoints), each task starts on the checkpoint its card names the default
(``pipelines/catalog.py``), and the model picked says what it is in an info line. A text encoder is
listed for a task only when its card's measured rate keeps within 3 points of MiniLM's, and the
encoder choice says in one line which are not and why. The Video tab's prompt says what the models
read, and a clip whose prompt they cannot read gets a note beside it (``prompts.py``). A model trained on
one caption template gets the prompt rewritten to it (a checkbox on the Video and Compare tabs turns that
off), and the page shows what it was given: "read as: the digit 3 moves left". Inputs
are ``fields.Raw*`` components, so every value reaches the handler's named checks.

A run's progress, and its error when it fails, show on the tab's status line under its button, not on
the outputs: a failed request keeps the previous outputs on the page (Gradio puts an "Error" badge over
every output it tracks), and its one-line message shows as a notice. Steps: the Image and Compare tabs
start each task at its own steps (``Limits.start_steps``), which is also what the API takes when a call
leaves steps out; a mode or task switch moves steps along only while the user has not typed a value."""

from __future__ import annotations

import gradio as gr

from .compare import REFERENCE, carry_labels, config_label, task_labels
from .fields import RawCheckbox, RawCheckboxGroup, RawNumber, RawRadio
from .bench_results import SERIES
from .handlers import BENCH_SOURCES, COMPARE_TASKS, IMAGE_MODES, MediagenApp
from .limits import log, rejected
from .models import describe_models

INTRO = ("**mediagen**: image and video diffusion transformers whose self-attention runs on MHLA "
         "(token-level multi-head linear attention). Checkpoints served: {models}. "
         "Limits on this server ({device}): {limits}.")
COMPARE_NOTE = ("The same seed through each configuration; `{reference}` is the reference (always run first). "
                "Quality columns are reference-free: for clips, whether the asked digit is shown (`digit`) and moves "
                "the asked way (`direction`), beside what the scorer read (`read as`, `moved`); for images, the digit "
                "classifier's probability of the asked digit and the digit it reads. Class-to-image involves no text "
                "encoder, so its configurations are the attentions alone. "
                "SSIM / PSNR *to the reference* only measure agreement with the sdpa sample, not quality: two good "
                "samples can differ everywhere, and an empty frame shares the reference's dark background, so a "
                "blank output is marked `blank` and gets no SSIM / PSNR.")


def _common_controls(app: MediagenApp, d: dict, steps_value):
    """Seed, steps and guidance. ``steps_value`` None leaves the box empty in the page's config, which is
    what makes steps optional in the API (a call that leaves it out gets the task's own steps); the page
    then fills the box on load (``build_demo``)."""
    lim = app.limits
    seed = RawNumber(value=0, precision=0, label=f"seed (0–{d['max_seed']})", elem_id="seed")
    steps = RawNumber(value=steps_value, precision=0, label=f"steps (1–{lim.max_steps})")
    guidance = RawNumber(value=4.0, label=f"guidance (0–{lim.max_guidance:g}; ≤ 1 turns it off)")
    return seed, steps, guidance


def _typed(steps):
    """A flag set when the user types into ``steps`` (``.input`` fires on the user's edits only): a mode or
    task switch then leaves the value alone."""
    typed = gr.State(False)
    steps.input(lambda: True, None, typed, api_name=False, queue=False, show_progress="hidden")
    return typed


def _status(name: str):
    """The tab's status line: where its run shows progress and, when it fails, the error, so that the
    outputs keep what they showed (``show_progress_on``)."""
    return gr.Markdown("", elem_id=f"{name}-status", min_height=40)


def _runtime_radio(app: MediagenApp):
    """The runtime choice, shown only where there is one: a CPU server runs eager only (``runtimes``)."""
    offered = app.runtimes()
    return RawRadio(offered, value="eager", label="runtime", visible=len(offered) > 1,
                    info="how the denoising loop runs: compile (torch.compile) and cuda-graphs compile on a model's "
                         "first request at a size (that one takes longer, and its time estimate does not count "
                         "the compiling); outputs match eager")


def _size_controls(d: dict, suffix: str = "", visible: bool = True):
    (lo_h, hi_h), (lo_w, hi_w) = d["side_range_h"], d["side_range_w"]
    height = RawNumber(value=d["height"], precision=0, visible=visible,
                       label=f"height ({lo_h}–{hi_h}, multiple of {d['stride_h']}{suffix})")
    width = RawNumber(value=d["width"], precision=0, visible=visible,
                      label=f"width ({lo_w}–{hi_w}, multiple of {d['stride_w']}{suffix})")
    return height, width


def _prompt_box(app: MediagenApp, value: str, label: str, **kwargs):
    """A prompt textbox that stops at the server's length while typing (the handler checks it too)."""
    return gr.Textbox(value=value, label=label, max_length=app.limits.max_prompt_chars, **kwargs)


# the task each page mode draws: its attention choice starts on that task's default (the checkpoints' cards)
MODE_TASKS = {"class": "class-to-image", "prompt": "text-to-image", "video": "text-to-video"}


def _first_choice(app: MediagenApp, mode: str) -> str:
    return app.cache.models.first_choice(MODE_TASKS[mode])


def _attention_radio(app: MediagenApp, d: dict, family: str):
    offered = d["offered"][family]
    value = _first_choice(app, "class" if family == "image" else "video")
    radio = RawRadio(offered, value=value, label="attention", info="only trained checkpoints are offered")
    info = gr.Markdown(app.info(family, value))
    return radio, info


def _encoder_radio(d: dict, task: str, **kwargs):
    """The text encoder choice of ``task``: the encoders offered for it, with the one line on those that are
    not (their cards' rates against MiniLM's) as its info."""
    offered = d["encoders"][task]
    return RawRadio(offered, value=offered[0], info=d["encoder_notes"][task] or None, **kwargs)


def _image_tab(app: MediagenApp, d: dict):
    lim = app.limits
    with gr.Row():
        with gr.Column():
            mode = RawRadio(list(IMAGE_MODES), value="class", label="condition on",
                            info=f"class: the {d['image_side']}px class-conditional digit model; "
                                 "prompt: the text-to-video model, one frame")
            class_label = RawNumber(value=3, precision=0, label=f"class (0–{d['num_classes'] - 1})")
            # the page starts in class mode: what only prompt mode reads starts hidden
            prompt = _prompt_box(app, "the digit 7", "prompt", visible=False)
            negative = _prompt_box(app, "", "negative prompt", visible=False)
            attention, info = _attention_radio(app, d, "image")
            encoder = _encoder_radio(d, "text-to-image", label="text encoder (prompt mode)", visible=False)
            encoder_note = gr.Markdown(app.encoder_info(encoder.value), visible=False)
            with gr.Row():
                batch = RawNumber(value=min(2, lim.max_batch), precision=0, label=f"batch (1–{lim.max_batch})")
                height, width = _size_controls(d, ", prompt mode", visible=False)
            seed, steps, guidance = _common_controls(app, d, None)
            typed = _typed(steps)
            runtime = _runtime_radio(app)
            rewrite = _rewrite_box("image-rewrite", visible=False)
            run = gr.Button("Generate image", variant="primary", elem_id="image-run")
            status = _status("image")
        with gr.Column():
            gallery = gr.Gallery(label="images", columns=2, elem_id="image-gallery")
            # prompt mode: how the prompt was read and what in it the models cannot read, as the Video tab
            note = gr.Markdown("", label="prompt note", elem_id="image-note")
            downloads = gr.File(label="download", file_count="multiple")
            timings = gr.JSON(label="latency per stage (ms)")

    def on_mode(mode_value, steps_typed):
        family = "image" if mode_value == "class" else "video"
        offered = d["offered"][family]
        value = _first_choice(app, mode_value)  # another mode draws with another model
        prompt_mode = mode_value != "class"
        return (gr.update(choices=offered, value=value), app.info(family, value), gr.update(visible=not prompt_mode),
                *(gr.update(visible=prompt_mode) for _ in range(7)),
                gr.update() if steps_typed else gr.update(value=lim.start_steps(prompt_mode)))

    mode.change(on_mode, [mode, typed], [attention, info, class_label, prompt, negative, encoder, encoder_note, height,
                                         width, rewrite, steps], api_name=False)
    encoder.change(app.encoder_info, encoder, encoder_note, api_name=False)
    attention.change(lambda m, a: app.info("image" if m == "class" else "video", a), [mode, attention], info,
                     api_name=False)
    run.click(app.image, [mode, class_label, prompt, negative, attention, encoder, batch, seed, steps, guidance,
                          height, width, runtime, rewrite], [gallery, downloads, timings, note],
              api_name="generate_image",
              show_progress_on=[status])
    return steps


def _rewrite_box(elem_id: str, visible: bool = True) -> gr.Checkbox:
    """The switch for prompt rewriting: on, a model trained on one caption template gets the prompt in it."""
    return RawCheckbox(value=True, label="rewrite the prompt to the model's caption template",
                       info="the shipped video models were trained on one wording (\"the digit 3 moves left\") and "
                            "draw the asked digit far less often from others; the output says how the prompt was read",
                       elem_id=elem_id, visible=visible)


def _video_tab(app: MediagenApp, d: dict):
    lim = app.limits
    with gr.Row():
        with gr.Column():
            prompt = _prompt_box(app, "the digit 7 moves left", "prompt", info=app.prompt_help())
            negative = _prompt_box(app, "", "negative prompt")
            attention, info = _attention_radio(app, d, "video")
            encoder = _encoder_radio(d, "text-to-video", label="text encoder")
            encoder_note = gr.Markdown(app.encoder_info(encoder.value))
            with gr.Row():
                frames = RawNumber(value=d["frames"], precision=0, label=f"frames (2–{lim.max_frames})")
                height, width = _size_controls(d)
                batch = RawNumber(value=1, precision=0, label=f"batch (1–{lim.max_batch})")
            seed, steps, guidance = _common_controls(app, d, lim.start_steps(False))   # one task: one default
            runtime = _runtime_radio(app)
            rewrite = _rewrite_box("video-rewrite")
            run = gr.Button("Generate video", variant="primary", elem_id="video-run")
            status = _status("video")
        with gr.Column():
            video = gr.Video(label="video", elem_id="video-output")
            # the prompt as the model was given it ("read as: ...") and what in it the models cannot read, beside
            # the clip drawn from it ("" when neither applies)
            note = gr.Markdown("", label="prompt note", elem_id="video-note")
            downloads = gr.File(label="download", file_count="multiple")
            timings = gr.JSON(label="latency per stage (ms)")
    attention.change(lambda a: app.info("video", a), attention, info, api_name=False)
    encoder.change(app.encoder_info, encoder, encoder_note, api_name=False)
    run.click(app.video, [prompt, negative, attention, encoder, frames, height, width, batch, seed, steps, guidance,
                          runtime, rewrite], [video, downloads, timings, note], api_name="generate_video",
              show_progress_on=[status])


def compare_choices(d: dict, task: str) -> list[str]:
    """The configurations the Compare tab lists for ``task``: attention x text encoder for the text tasks,
    the attention alone for class-to-image (its model reads no text)."""
    family = "image" if task == "class-to-image" else "video"
    return task_labels(task, d["offered"][family], d["encoders"].get(task, d["text_encoders"]))


def compare_note(d: dict, task: str) -> str | None:
    """The configurations' info line for ``task``: which text encoders it does not offer and why (None: none)."""
    return d["encoder_notes"].get(task) or None


def compare_visibility(task: str) -> dict:
    """Which Compare inputs apply to ``task``: the prompt and the size to the text tasks, frames to
    clips only, the class to class-to-image."""
    text = task != "class-to-image"
    return {"prompt": text, "class_label": not text, "frames": task == "text-to-video", "height": text, "width": text}


def _compare_tab(app: MediagenApp, d: dict):
    lim = app.limits
    first = "text-to-video"
    choices = compare_choices(d, first)
    # the task's default attention (with the first text encoder) beside the reference, which always runs
    label = config_label(app.cache.models.first_choice(first), d["encoders"][first][0])
    default = [label] if label in choices and label != config_label(*REFERENCE) else []
    shown = compare_visibility(first)
    gr.Markdown(COMPARE_NOTE.format(reference=config_label(*REFERENCE)))
    with gr.Row():
        with gr.Column():
            task = RawRadio(list(COMPARE_TASKS), value=first, label="task")
            configs = RawCheckboxGroup(choices, value=default, label=f"configurations (≤ {lim.max_configs} with the "
                                       "reference; trained checkpoints only)", elem_id="compare-configs",
                                       info=compare_note(d, first))
            prompt = _prompt_box(app, "the digit 7 moves left", "prompt (text tasks)", visible=shown["prompt"])
            class_label = RawNumber(value=3, precision=0, label=f"class (class-to-image, 0–{d['num_classes'] - 1})",
                                    visible=shown["class_label"])
        with gr.Column():
            with gr.Row():
                frames = RawNumber(value=d["frames"], precision=0, label=f"frames (video, 2–{lim.max_frames})",
                                   visible=shown["frames"])
                height, width = _size_controls(d)
            seed, steps, guidance = _common_controls(app, d, None)
            typed = _typed(steps)
            rewrite = _rewrite_box("compare-rewrite")
            run = gr.Button("Compare", variant="primary", elem_id="compare-run")
            status = _status("compare")
    # results span the page: the table has up to 13 short columns and needs the full width
    gallery = gr.Gallery(label="outputs, side by side", columns=6, height="auto", elem_id="compare-gallery")
    table = gr.Dataframe(label="quality (reference-free), latency (ms), agreement with the reference", wrap=False,
                         elem_id="compare-table")
    with gr.Row():
        downloads = gr.File(label="download", file_count="multiple")
        details = gr.JSON(label="all numbers")

    def on_task(task_value, current, steps_typed=False):
        task_value = task_value if task_value in COMPARE_TASKS else first
        family = "image" if task_value == "class-to-image" else "video"
        visible = compare_visibility(task_value)
        encoders = d["encoders"].get(task_value, d["text_encoders"])
        return (gr.update(choices=compare_choices(d, task_value), info=compare_note(d, task_value),
                          value=carry_labels(current, task_value, d["offered"][family], encoders)),
                *(gr.update(visible=visible[name]) for name in ("prompt", "class_label", "frames", "height", "width")),
                gr.update() if steps_typed else gr.update(value=lim.start_steps(task_value == "text-to-image")))

    task.change(on_task, [task, configs, typed], [configs, prompt, class_label, frames, height, width, steps],
                api_name=False)
    run.click(app.compare, [task, configs, prompt, class_label, seed, steps, guidance, frames, height, width, rewrite],
              [gallery, downloads, table, details], api_name="compare", show_progress_on=[status])
    return steps


def _bench_tab(app: MediagenApp):
    gr.Markdown(f"Attention latency against sequence length: `recorded` plots the latency shipped with the package "
                f"(`{app.results_path.name}`, written on a GPU by `benchmarks/attention.py --json`); "
                "`fresh` times `mediagen bench`'s attention shapes on this server's device now, MHLA as the models "
                "run it here (the op's default path: blocked on a CPU, Triton on a GPU) against SDPA: one warm-up "
                "pass, then the median of three passes, with their spread (min–max) as bars and in the table, since "
                "a shared CPU's timings vary. "
                "`series`: MHLA against the fastest SDPA backend at each length, or every method. "
                "Below, the models' sampling time per clip against tokens per clip, MHLA beside softmax "
                f"(`{app.model_results_path.name}`, recorded by `python -m benchmarks record_model_latency` from "
                "`python -m benchmarks video_latency --out` runs), with the MHLA / softmax ratio per token count.")
    source = RawRadio(list(BENCH_SOURCES), value="recorded", label="source")
    series = RawRadio(list(SERIES), value=SERIES[0], label="series")
    run = gr.Button("Plot", variant="primary", elem_id="bench-run")
    status = _status("bench")
    plot = gr.Image(label="latency vs sequence length", type="filepath")
    table = gr.Markdown(label="latency table")         # the label names this output in the API
    downloads = gr.File(label="download", file_count="multiple")
    with gr.Row():
        model_plot = gr.Image(label="sampling time per clip vs tokens per clip", type="filepath", scale=3)
        model_table = gr.Markdown(label="sampling time table", scale=2)
    run.click(app.benchmarks, [source, series], [plot, table, downloads], api_name="benchmarks",
              show_progress_on=[status])
    # the recorded sampling time per clip, shown with either source (a CPU-only server cannot time clips in a
    # request); not an API endpoint of its own
    run.click(app.model_latency, None, [model_plot, model_table], api_name=False, show_progress_on=[status])


def build_demo(app: MediagenApp, concurrency: int = 2, max_queue: int = 32) -> gr.Blocks:
    d = app.page_defaults()
    with gr.Blocks(title="mediagen", delete_cache=(3600, 6 * 3600)) as demo:
        gr.Markdown(INTRO.format(models=describe_models(app.cache.models), device=app.cache.device.type,
                                 limits=app.limits.describe()))
        with gr.Tabs():
            with gr.Tab("Image", id="image"):
                image_steps = _image_tab(app, d)
            with gr.Tab("Video", id="video"):
                _video_tab(app, d)
            with gr.Tab("Compare", id="compare"):
                compare_steps = _compare_tab(app, d)
            with gr.Tab("Benchmarks", id="benchmarks"):
                _bench_tab(app)
        # both steps boxes are empty in the config (API callers get each task's own steps); the page shows
        # the steps of the task each tab starts on (class images, text-to-video), set in the browser as the
        # page loads (no round trip to the server)
        start = app.limits.start_steps(False)
        demo.load(None, None, [image_steps, compare_steps], js=f"() => [{start}, {start}]", api_name=False,
                  queue=False, show_progress="hidden")
    demo.queue(default_concurrency_limit=concurrency, max_size=max_queue)
    demo.validate_inputs = _too_few_inputs          # on the instance: Blocks subclasses are not needed for one check
    return demo


def _input_names(block_fn) -> list[str]:
    """The names of an event's inputs: its function's parameters, in order (as the API lists them)."""
    import inspect

    params = [n for n in inspect.signature(block_fn.fn).parameters if n != "progress"]
    return params[:len(block_fn.inputs)]


def _too_few_inputs(block_fn, inputs) -> None:
    """A call with fewer inputs than the endpoint takes (a raw HTTP or JavaScript call; ``gradio_client``
    fills in defaults) gets one line naming the endpoint and its inputs in order. Gradio's own answer is a
    paragraph listing the components as Python object reprs."""
    needed = block_fn.inputs
    if len(inputs) < len(needed):
        name = f"/{block_fn.api_name}" if block_fn.api_name else block_fn.name
        raise rejected(f"{name} got {len(inputs)} input value{'s' * (len(inputs) != 1)} but takes {len(needed)}: "
                       f"give {', '.join(_input_names(block_fn))}, in this order")


def api_names(demo: gr.Blocks) -> list[str]:
    """The demo's named API endpoints ("/generate_image", ...)."""
    fns = demo.fns.values() if isinstance(demo.fns, dict) else demo.fns
    return [f"/{fn.api_name}" for fn in fns if fn.api_name and getattr(fn, "api_visibility", "public") == "public"]


def unknown_endpoint_handler(demo: gr.Blocks):
    """A FastAPI exception handler for a call to an API name the demo does not have: a 404 with one line
    naming the endpoints it has, and one line in the log (Gradio answers 500, with a traceback in the log)."""
    from fastapi.responses import JSONResponse

    def handler(request, exc):
        name = request.path_params.get("api_name", "")
        message = f"there is no API endpoint /{name} on this server: use one of {api_names(demo)}"
        log.warning("rejected: %s", message)
        return JSONResponse({"error": message}, status_code=404)

    return handler

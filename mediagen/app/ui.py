"""The page: tabs Image, Video, Compare and Benchmarks, each wired to one API endpoint of
``MediagenApp`` (api names: generate_image, generate_video, compare, benchmarks)."""

from __future__ import annotations

import gradio as gr

from .compare import REFERENCE, config_label
from .handlers import BENCH_SOURCES, COMPARE_TASKS, IMAGE_MODES, MediagenApp
from .models import ATTENTIONS

INTRO = ("**mediagen**: image and video diffusion transformers whose self-attention runs on MHLA "
         "(token-level multi-head linear attention). Models: {models}. Limits: {limits}.")


def _common_controls(limits, steps: int = 8):
    seed = gr.Number(value=0, precision=0, label="seed", elem_id="seed")
    steps = gr.Number(value=min(steps, limits.max_steps), precision=0, label=f"steps (1–{limits.max_steps})")
    guidance = gr.Number(value=4.0, label=f"guidance (0–{limits.max_guidance:g}; ≤ 1 turns it off)")
    return seed, steps, guidance


def _image_tab(app: MediagenApp, d: dict):
    lim = app.limits
    with gr.Row():
        with gr.Column():
            mode = gr.Radio(list(IMAGE_MODES), value="class", label="condition on",
                            info=f"class: the {d['image_side']}px class-conditional digit model; prompt: the text model, one frame")
            class_label = gr.Number(value=3, precision=0, label=f"class (0–{d['num_classes'] - 1})")
            prompt = gr.Textbox(value="the digit 7", label="prompt")
            negative = gr.Textbox(value="", label="negative prompt")
            attention = gr.Radio(list(ATTENTIONS), value="mhla", label="attention")
            encoder = gr.Radio(d["text_encoders"], value=d["text_encoders"][0], label="text encoder (prompt mode)")
            with gr.Row():
                batch = gr.Number(value=2, precision=0, label=f"batch (1–{lim.max_batch})")
                height = gr.Number(value=d["height"], precision=0, label=f"height (≤ {lim.max_side}, prompt mode)")
                width = gr.Number(value=d["width"], precision=0, label=f"width (≤ {lim.max_side}, prompt mode)")
            seed, steps, guidance = _common_controls(lim)
            run = gr.Button("Generate image", variant="primary", elem_id="image-run")
        with gr.Column():
            gallery = gr.Gallery(label="images", columns=2, elem_id="image-gallery")
            downloads = gr.File(label="download", file_count="multiple")
            timings = gr.JSON(label="latency per stage (ms)")
    run.click(app.image, [mode, class_label, prompt, negative, attention, encoder, batch, seed, steps, guidance,
                          height, width], [gallery, downloads, timings], api_name="generate_image")


def _video_tab(app: MediagenApp, d: dict):
    lim = app.limits
    with gr.Row():
        with gr.Column():
            prompt = gr.Textbox(value="the digit 7 moves left", label="prompt")
            negative = gr.Textbox(value="", label="negative prompt")
            attention = gr.Radio(list(ATTENTIONS), value="mhla", label="attention")
            encoder = gr.Radio(d["text_encoders"], value=d["text_encoders"][0], label="text encoder")
            with gr.Row():
                frames = gr.Number(value=d["frames"], precision=0, label=f"frames (2–{lim.max_frames})")
                height = gr.Number(value=d["height"], precision=0, label=f"height (≤ {lim.max_side})")
                width = gr.Number(value=d["width"], precision=0, label=f"width (≤ {lim.max_side})")
                batch = gr.Number(value=1, precision=0, label=f"batch (1–{lim.max_batch})")
            seed, steps, guidance = _common_controls(lim)
            run = gr.Button("Generate video", variant="primary", elem_id="video-run")
        with gr.Column():
            video = gr.Video(label="video", elem_id="video-output")
            downloads = gr.File(label="download", file_count="multiple")
            timings = gr.JSON(label="latency per stage (ms)")
    run.click(app.video, [prompt, negative, attention, encoder, frames, height, width, batch, seed, steps, guidance],
              [video, downloads, timings], api_name="generate_video")


def _compare_tab(app: MediagenApp, d: dict):
    lim = app.limits
    choices = [config_label(a, e) for e in d["text_encoders"] for a in ATTENTIONS]
    default = [config_label("mhla", REFERENCE[1]), config_label("hybrid", REFERENCE[1])]
    gr.Markdown(f"The same seed through each configuration; `{config_label(*REFERENCE)}` is the reference "
                "(always run). PSNR/SSIM measure agreement with it; images also get digit-classifier scores, "
                "videos VBench-style scores (pixel features for consistency).")
    with gr.Row():
        with gr.Column():
            task = gr.Radio(list(COMPARE_TASKS), value="text-to-video", label="task")
            configs = gr.CheckboxGroup(choices, value=default, label=f"configurations (≤ {lim.max_configs} with the reference)",
                                       elem_id="compare-configs")
            prompt = gr.Textbox(value="the digit 7 moves left", label="prompt (text tasks)")
            class_label = gr.Number(value=3, precision=0, label=f"class (class-to-image, 0–{d['num_classes'] - 1})")
            with gr.Row():
                frames = gr.Number(value=d["frames"], precision=0, label=f"frames (video, ≤ {lim.max_frames})")
                height = gr.Number(value=d["height"], precision=0, label=f"height (≤ {lim.max_side})")
                width = gr.Number(value=d["width"], precision=0, label=f"width (≤ {lim.max_side})")
            seed, steps, guidance = _common_controls(lim)
            run = gr.Button("Compare", variant="primary", elem_id="compare-run")
        with gr.Column():
            gallery = gr.Gallery(label="outputs, side by side", columns=3, elem_id="compare-gallery")
            table = gr.Dataframe(label="latency (ms) and quality", wrap=True)
            downloads = gr.File(label="download", file_count="multiple")
            details = gr.JSON(label="all numbers")
    run.click(app.compare, [task, configs, prompt, class_label, seed, steps, guidance, frames, height, width],
              [gallery, downloads, table, details], api_name="compare")


def _bench_tab(app: MediagenApp):
    gr.Markdown(f"Attention latency against sequence length: `recorded` reads `{app.results_path}`; "
                "`fresh` times `mediagen bench`'s attention shapes on this server's device now.")
    source = gr.Radio(list(BENCH_SOURCES), value="recorded", label="source")
    run = gr.Button("Plot", variant="primary", elem_id="bench-run")
    plot = gr.Image(label="latency vs sequence length", type="filepath")
    table = gr.Markdown()
    downloads = gr.File(label="download", file_count="multiple")
    run.click(app.benchmarks, [source], [plot, table, downloads], api_name="benchmarks")


def build_demo(app: MediagenApp, concurrency: int = 2, max_queue: int = 32) -> gr.Blocks:
    d = app.page_defaults()
    models = f"{_describe(app.cache.models.image.base)} (images), {_describe(app.cache.models.video.base)} (text)"
    with gr.Blocks(title="mediagen", delete_cache=(3600, 6 * 3600)) as demo:
        gr.Markdown(INTRO.format(models=models, limits=app.limits.describe()))
        with gr.Tabs():
            with gr.Tab("Image", id="image"):
                _image_tab(app, d)
            with gr.Tab("Video", id="video"):
                _video_tab(app, d)
            with gr.Tab("Compare", id="compare"):
                _compare_tab(app, d)
            with gr.Tab("Benchmarks", id="benchmarks"):
                _bench_tab(app)
    demo.queue(default_concurrency_limit=concurrency, max_size=max_queue)
    return demo


def _describe(base) -> str:
    return base if isinstance(base, str) else "custom preset"

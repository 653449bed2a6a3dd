"""The app's request functions, one per API endpoint. Each checks its inputs against the limits
(a readable ``gr.Error`` when out of bounds), runs on the cached models, writes its outputs to a
fresh folder and returns what the page shows and what can be downloaded.

Bad input that only the models can judge (a size the patch grid does not divide, a frame count
the autoencoder cannot take) raises ``ValueError`` inside; it reaches the user as ``gr.Error`` with
the same message.
"""

from __future__ import annotations

import functools
from pathlib import Path

import gradio as gr

from . import bench_results, compare, files, generation
from .limits import Limits, bounded_float, bounded_int, bounded_prompt, bounded_side
from .models import ATTENTIONS, ModelCache, ModelSet, default_models
from .sizes import default_video_size, image_side, video_geometry

IMAGE_MODES = ("class", "prompt")
COMPARE_TASKS = ("text-to-video", "text-to-image", "class-to-image")
BENCH_SOURCES = ("recorded", "fresh")
MAX_SEED = 2**31 - 1


def readable_errors(fn):
    """ValueError / FileNotFoundError (bad input, missing file) become ``gr.Error`` with their message."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except gr.Error:
            raise
        except (ValueError, FileNotFoundError) as err:
            raise gr.Error(str(err)) from None

    return wrapper


def _ms(timings: dict) -> dict:
    out = {f"{k}_ms": round(1e3 * v, 1) for k, v in timings.items()}
    out["total_ms"] = round(sum(out.values()), 1)
    return out


def _choice(name: str, value, allowed) -> str:
    if value not in allowed:
        raise gr.Error(f"{name}={value!r} is not allowed: choose one of {list(allowed)}")
    return value


class MediagenApp:
    """The app's state: models (loaded once), limits, where outputs go, where results are read."""

    def __init__(self, models: ModelSet | None = None, limits: Limits | None = None, device=None,
                 output_dir=None, results_path=None, bench_shapes=None):
        self.cache = ModelCache(models or default_models(), device)
        self.limits = limits or Limits()
        self.output_root = files.output_root(output_dir)
        self.results_path = Path(results_path) if results_path else bench_results.default_results_path()
        self.bench_shapes = bench_shapes

    # --- shared checks -----------------------------------------------------------------------
    def _common(self, seed, steps, guidance) -> tuple[int, int, float]:
        return (bounded_int("seed", seed, 0, MAX_SEED), bounded_int("steps", steps, 1, self.limits.max_steps),
                bounded_float("guidance", guidance, 0.0, self.limits.max_guidance))

    def _text_size(self, height, width, frames) -> tuple[int, int, int]:
        g = video_geometry(self.cache)
        return (bounded_side("height", height, g.stride_h, self.limits),
                bounded_side("width", width, g.stride_w, self.limits),
                bounded_int("frames", frames, 1, self.limits.max_frames))

    def _encoder(self, label) -> str:
        return _choice("text_encoder", label, self.cache.models.text_encoders)

    # --- Image -------------------------------------------------------------------------------
    @readable_errors
    def image(self, mode, class_label, prompt, negative_prompt, attention, text_encoder, batch, seed, steps,
              guidance, height, width, progress=gr.Progress(track_tqdm=True)):
        mode = _choice("mode", mode, IMAGE_MODES)
        attention = _choice("attention", attention, ATTENTIONS)
        batch = bounded_int("batch", batch, 1, self.limits.max_batch)
        seed, steps, guidance = self._common(seed, steps, guidance)
        progress(0, desc="loading models")
        if mode == "class":
            num_classes = int(self.cache.base("image").transformer.config.num_embeds_ada_norm)
            label = bounded_int("class_label", class_label, 0, num_classes - 1)
            result = generation.class_images(self.cache, attention, label, batch, seed, steps, guidance)
            stem = f"class{label}-{attention}-seed{seed}"
        else:
            prompt = bounded_prompt(prompt, self.limits)
            negative_prompt = bounded_prompt(negative_prompt, self.limits)
            h, w, _ = self._text_size(height, width, 1)
            result = generation.text_samples(self.cache, attention, self._encoder(text_encoder), prompt,
                                             negative_prompt, batch, seed, steps, guidance, h, w, 1)
            stem = f"{files.slug(prompt)[:40]}-{attention}-seed{seed}"
        folder = files.request_dir(self.output_root, "image")
        downloads, previews = files.save_images(result.samples, folder, stem)
        return previews, downloads, _ms(result.timings)

    # --- Video -------------------------------------------------------------------------------
    @readable_errors
    def video(self, prompt, negative_prompt, attention, text_encoder, frames, height, width, batch, seed, steps,
              guidance, progress=gr.Progress(track_tqdm=True)):
        prompt = bounded_prompt(prompt, self.limits)
        negative_prompt = bounded_prompt(negative_prompt, self.limits)
        attention = _choice("attention", attention, ATTENTIONS)
        encoder = self._encoder(text_encoder)
        h, w, f = self._text_size(height, width, frames)
        if f < 2:
            raise gr.Error(f"frames={f}: a video needs at least 2 frames (use the Image tab for one)")
        batch = bounded_int("batch", batch, 1, self.limits.max_batch)
        seed, steps, guidance = self._common(seed, steps, guidance)
        progress(0, desc="loading models")
        result = generation.text_samples(self.cache, attention, encoder, prompt, negative_prompt, batch, seed, steps,
                                         guidance, h, w, f)
        folder = files.request_dir(self.output_root, "video")
        downloads, _ = files.save_videos(result.samples, folder, f"{files.slug(prompt)[:40]}-{attention}-seed{seed}")
        return downloads[0], downloads, _ms(result.timings)

    # --- Compare -----------------------------------------------------------------------------
    @readable_errors
    def compare(self, task, configs, prompt, class_label, seed, steps, guidance, frames, height, width,
                progress=gr.Progress(track_tqdm=True)):
        task = _choice("task", task, COMPARE_TASKS)
        encoders = list(self.cache.models.text_encoders)
        chosen = [compare.parse_config(c, ATTENTIONS, encoders) for c in (configs or [])]
        planned = compare.plan(task, chosen)
        if len(planned) > self.limits.max_configs:
            raise gr.Error(f"{len(planned)} configurations (with the sdpa · FlashAttention reference) is too many: "
                           f"this server compares at most {self.limits.max_configs} at once")
        seed, steps, guidance = self._common(seed, steps, guidance)
        req = compare.CompareRequest(task, planned, seed, steps, guidance)
        if task == "class-to-image":
            num_classes = int(self.cache.base("image").transformer.config.num_embeds_ada_norm)
            req.class_label = bounded_int("class_label", class_label, 0, num_classes - 1)
        else:
            req.prompt = bounded_prompt(prompt, self.limits)
            req.height, req.width, req.frames = self._text_size(height, width, frames if task == "text-to-video" else 1)
            if task == "text-to-video" and req.frames < 2:
                raise gr.Error(f"frames={req.frames}: a video needs at least 2 frames")
        rows = compare.compare(self.cache, req, progress)
        return self._compare_outputs(rows, seed)

    def _compare_outputs(self, rows, seed):
        folder = files.request_dir(self.output_root, "compare")
        gallery, downloads = [], []
        for row in rows:
            stem = f"{files.slug(row['config'])}-seed{seed}"
            sample = row.pop("sample")[None]
            if sample.ndim == 5:
                got, previews = files.save_videos(sample, folder, stem)
            else:
                got, previews = files.save_images(sample, folder, stem)
            downloads += got
            gallery.append((previews[0], row["config"]))
        columns = ["config", "text_encoding_ms", "denoising_ms", "decoding_ms", "total_ms", "psnr_db", "ssim"]
        columns += sorted({k for r in rows for k in r} - set(columns) - {"attention", "text_encoder"})
        table = [[_cell(r.get(c)) for c in columns] for r in rows]
        details = [{k: compare.finite(v) for k, v in r.items()} for r in rows]
        return gallery, downloads, {"headers": columns, "data": table}, details

    # --- Benchmarks ----------------------------------------------------------------------------
    @readable_errors
    def benchmarks(self, source, progress=gr.Progress(track_tqdm=True)):
        source = _choice("source", source, BENCH_SOURCES)
        if source == "recorded":
            rows, title = bench_results.read_results(self.results_path), f"recorded: {self.results_path.name}"
        else:
            progress(0, desc="timing attention")
            rows = bench_results.fresh_rows(self.cache.device, shapes=self.bench_shapes)
            title = f"measured now on {self.cache.device.type}"
        from ..eval.latency_plot import plot_latency

        folder = files.request_dir(self.output_root, "bench")
        plot = plot_latency(rows, folder / "latency.png", title=f"attention latency vs sequence length ({title})")
        table = bench_results.markdown(rows)
        (folder / "latency.md").write_text(table + "\n")
        return plot, f"**{title}**\n\n{table}", [plot, str(folder / "latency.md")]

    # --- defaults for the page -----------------------------------------------------------------
    def page_defaults(self) -> dict:
        size = default_video_size(self.cache)
        return {"image_side": image_side(self.cache), **size,
                "num_classes": int(self.cache.base("image").transformer.config.num_embeds_ada_norm),
                "text_encoders": list(self.cache.models.text_encoders)}


def _cell(value):
    if isinstance(value, float):
        if value == float("inf"):
            return "∞ (reference)"
        return f"{value:.4g}"
    return "" if value is None else str(value)

"""The app's request functions, one per API endpoint. Each checks its inputs against the limits
(a readable ``gr.Error`` when out of bounds), runs on the cached models, writes its outputs to a
fresh folder and returns what the page shows and what can be downloaded.

Bad input that only the models can judge (a size the patch grid does not divide, a frame count
the autoencoder cannot take, an attention the family does not offer) raises ``ValueError`` inside;
it reaches the user as ``gr.Error`` with the same one-line message, and the log gets that line
rather than a traceback.
"""

from __future__ import annotations

import functools
from pathlib import Path

import gradio as gr
import torch

from ..pipelines.generate_cli import DTYPES, MAX_SEED
from ..pipelines.names import RUNTIMES
from ..pipelines.prompts import prompt_note, size_note
from . import bench_results, compare, files, generation
from .limits import Limits, TimeBudget, bounded_float, bounded_int, bounded_prompt, bounded_side, rejected
from .models import (ModelCache, ModelSet, caption_template, default_models, encoder_details, encoder_info,
                     info_markdown, model_details, model_info, model_name, served_size, trained_on)
from .prompts import help_text, read_as
from .sizes import default_video_size, image_grid, image_side, video_geometry, video_grid

IMAGE_MODES = ("class", "prompt")
COMPARE_TASKS = ("text-to-video", "text-to-image", "class-to-image")
TEXT_TASKS = ("text-to-video", "text-to-image")      # the tasks that read a prompt through a text encoder
BENCH_SOURCES = ("recorded", "fresh")


def readable_errors(fn):
    """ValueError / FileNotFoundError (bad input, missing file) become ``gr.Error`` with their message."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except gr.Error:
            raise
        except (ValueError, FileNotFoundError) as err:
            raise rejected(str(err)) from None

    return wrapper


def _ms(timings: dict) -> dict:
    out = {f"{k}_ms": round(1e3 * v, 1) for k, v in timings.items()}
    out["total_ms"] = round(sum(out.values()), 1)
    return out


def _choice(name: str, value, allowed) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise rejected(f"{name}={value!r} is not allowed: choose one of {list(allowed)}")
    return value


def _flag(name: str, value) -> bool:
    """A checkbox's value: True or False (None, as an API call leaving it out: True)."""
    if value is None:
        return True
    if not isinstance(value, bool):
        raise rejected(f"{name}={value!r} is not allowed: use true or false")
    return value


def _family(task_or_mode: str) -> str:
    """Which model family serves an image mode or a Compare task."""
    return "image" if task_or_mode in ("class", "class-to-image") else "video"


class MediagenApp:
    """The app's state: models (loaded once), limits, where outputs go, where results are read."""

    def __init__(self, models: ModelSet | None = None, limits: Limits | None = None, device=None,
                 output_dir=None, results_path=None, bench_shapes=None, model_results_path=None):
        self.cache = ModelCache(models or default_models(), device)
        self.limits = limits or Limits.for_device(self.cache.device, served=served_size(self.cache.models.video))
        self.budget = TimeBudget(self.limits.max_request_s)
        self.output_root = files.output_root(output_dir)
        self.results_path = Path(results_path) if results_path else bench_results.default_results_path()
        self.bench_shapes = bench_shapes
        self.model_results_path = (Path(model_results_path) if model_results_path
                                   else bench_results.default_model_results_path())
        self._seed_budget()

    def _seed_budget(self) -> None:
        """The recorded sampling times of the served video checkpoints (the Benchmarks tab's model latency: the
        same checkpoint, eager, on a device of this kind and dtype) as the time model's estimates at sizes this
        server has not run: a first long clip is estimated before it runs. Nothing when none is recorded."""
        try:
            rows = bench_results.read_model_latency(self.model_results_path)
        except (FileNotFoundError, ValueError):
            return
        device = self.cache.device
        dtype = next((name for name, d in DTYPES.items() if d == self.cache.dtype), None)
        here = "cpu" if device.type == "cpu" else (torch.cuda.get_device_name(device) if device.type == "cuda" else "")
        served = {model_name(self.cache.models, "video", a): a for a in self.offered("video")}
        for row in rows:
            where = str(row.get("device", ""))
            if (row.get("runtime") != "eager" or row.get("pipeline") not in served or row.get("dtype") != dtype
                    or not here or bench_results.short_device(where) != here):
                continue
            steps, guidance, batch = int(row.get("steps", 0)), float(row.get("guidance", 1.0)), int(row.get("batch", 1))
            seconds = float(row.get("s_per_clip", 0.0)) * batch
            self.budget.prior(("video", served[row["pipeline"]]), steps,
                              TimeBudget.tokens(int(row["tokens_per_clip"]), batch, guidance), seconds,
                              f"the sampling times recorded for {row['pipeline']} on a {here} "
                              f"({self.model_results_path.name})")

    # --- shared checks -----------------------------------------------------------------------
    def _common(self, seed, steps, guidance) -> tuple[int, int, float]:
        return (bounded_int("seed", seed, 0, MAX_SEED), bounded_int("steps", steps, 1, self.limits.max_steps),
                bounded_float("guidance", guidance, 0.0, self.limits.max_guidance))

    def _text_size(self, height, width, frames, min_frames: int = 1) -> tuple[int, int, int]:
        """(height, width, frames) checked; one left out (None) is the page's starting value."""
        if None in (height, width, frames):
            start = self.page_defaults()
            height, width, frames = (start[k] if v is None else v
                                     for k, v in (("height", height), ("width", width), ("frames", frames)))
        g = video_geometry(self.cache)
        return (bounded_side("height", height, g.stride_h, self.limits),
                bounded_side("width", width, g.stride_w, self.limits),
                bounded_int("frames", frames, min_frames, self.limits.max_frames))

    def _encoder(self, label, task: str) -> str:
        """``label`` if the text encoder is offered for ``task`` (``ModelSet.check_encoder``: within 3 points
        of MiniLM's measured rate), else one line naming the field, the value, why and what is allowed."""
        return self.cache.models.check_encoder(task, label)

    def _config(self, label, offered: list[str], encoders: list[str], task: str) -> tuple[str, str]:
        """One Compare configuration, parsed; one naming a text encoder withheld from ``task`` says why."""
        try:
            return compare.parse_config(label, offered, encoders, task)
        except ValueError:
            attention, _, encoder = str(label).partition(compare.SEPARATOR)
            why = self.cache.models.encoder_why(task, encoder) if attention in offered else ""
            if why:
                raise ValueError(f"configs: {label!r} is not allowed for {task}: the {encoder} text encoder is not "
                                 f"offered for it ({why}); use a text encoder in {encoders}") from None
            raise

    def _attention(self, family: str, attention, field: str = "attention") -> str:
        if not isinstance(attention, str):
            raise rejected(f"{field}={attention!r} is not allowed: choose one of "
                           f"{self.cache.models.source(family).offered()}")
        return self.cache.models.check_attention(family, attention, field)

    def runtimes(self) -> list[str]:
        """Runtimes this server offers: all of them on a CUDA device, eager only elsewhere. On a CPU,
        torch.compile does not pay: compiling the default clip's model took minutes (far past the
        request bound, on the first request at every new size) and the compiled loop ran no faster
        than eager afterwards; CUDA graphs need a CUDA device."""
        return list(RUNTIMES) if self.cache.device.type == "cuda" else ["eager"]

    def _runtime(self, runtime) -> str:
        from ..pipelines.runtime import check_runtime

        runtime = _choice("runtime", runtime, RUNTIMES)
        offered = self.runtimes()
        if runtime not in offered:
            why = ("CUDA graphs need a CUDA device" if runtime == "cuda-graphs" else
                   "torch.compile takes minutes to compile on a CPU and runs no faster than eager there")
            raise rejected(f"runtime={runtime!r} is not offered on this server ({self.cache.device.type}): {why}; "
                           f"use one of {offered}")
        return check_runtime(runtime, self.cache.device)

    def offered(self, family: str) -> list[str]:
        return self.cache.models.source(family).offered()

    def info(self, family: str, attention) -> str:
        """The info line of the model behind (family, attention), for the page: one line, the card's
        details under it on a click."""
        if attention not in self.offered(family):
            return ""
        return info_markdown(model_info(self.cache.models, family, attention),
                             model_details(self.cache.models, family, attention))

    def encoder_info(self, label) -> str:
        """The info line of the text encoder behind ``label``, for the page (as ``info``)."""
        if not isinstance(label, str):
            return ""
        return info_markdown(encoder_info(self.cache.models, label), encoder_details(self.cache.models, label))

    # --- time: estimated before a run, measured after it -----------------------------------
    def _timed(self, family: str, attention: str, tokens: int, batch: int, steps: int, guidance: float, run,
               runtime: str = "eager"):
        """Run ``run()`` unless its estimated time is past the limit; record how long it took. Only
        eager runs are recorded: a compiled run's time includes compiling when its shapes are new."""
        key = (family, attention)
        per_pass = TimeBudget.tokens(tokens, batch, guidance)
        self.budget.check(key, steps, per_pass, lambda: self._fits_instead(family, attention, steps, per_pass))
        result = run()
        if runtime == "eager":
            self.budget.record(key, steps, per_pass, sum(result.timings.values()), result.step_seconds)
        return result

    def _fits_instead(self, family: str, attention: str, steps: int, per_pass: int) -> str:
        """For a refusal: the family's fastest other attention whose estimate for the same request is within
        the bound ("; mhla takes about 22 s for it here"), or "" when none is measured or fits."""
        bound = self.budget.max_seconds
        known = [(est, other) for other in self.offered(family) if other != attention
                 for est in [self.budget.estimate((family, other), steps, per_pass)]
                 if est is not None and (bound is None or est <= bound)]
        if not known:
            return ""
        est, other = min(known)
        return f"; {other} takes about {est:.0f} s for it here"

    def estimate(self, family: str, attention: str, tokens: int, batch: int, steps: int, guidance: float):
        """Estimated seconds of such a request on this server (None before one has run); ``tokens``: the
        request's token grid."""
        return self.budget.estimate((family, attention), steps, TimeBudget.tokens(tokens, batch, guidance))

    # --- Image -------------------------------------------------------------------------------
    @readable_errors
    def image(self, mode, class_label, prompt, negative_prompt, attention, text_encoder, batch, seed, steps=None,
              guidance=4.0, height=None, width=None, runtime="eager", rewrite_prompt=True,
              progress=gr.Progress(track_tqdm=True)):
        """Images of a class digit (mode "class") or of a prompt (mode "prompt": the middle frame of a clip), and
        a note: in prompt mode, as the Video tab, how the prompt was read when it was rewritten to the model's
        caption template (``rewrite_prompt``) and what in it the models cannot read; "" otherwise.
        steps left out (None): the mode's own, as the page starts it (more for a prompt-mode still)."""
        mode = _choice("mode", mode, IMAGE_MODES)
        family = _family(mode)
        attention = self._attention(family, attention)
        batch = bounded_int("batch", batch, 1, self.limits.max_batch)
        steps = self.limits.start_steps(mode == "prompt") if steps is None else steps
        seed, steps, guidance = self._common(seed, steps, guidance)
        runtime = self._runtime(runtime)
        if mode == "class":
            num_classes = int(self.cache.base("image").transformer.config.num_embeds_ada_norm)
            label = bounded_int("class_label", class_label, 0, num_classes - 1)
            progress(0, desc="loading models")
            tokens = _prod(image_grid(self.cache))
            result = self._timed(family, attention, tokens, batch, steps, guidance, lambda: generation.class_images(
                self.cache, attention, label, batch, seed, steps, guidance, runtime=runtime), runtime)
            stem, note = f"class{label}-{attention}-seed{seed}", ""
        else:
            prompt = bounded_prompt(prompt, self.limits)
            negative_prompt = bounded_prompt(negative_prompt, self.limits, "negative_prompt")
            given, line = self.read_as(prompt, attention, _flag("rewrite_prompt", rewrite_prompt))
            note = "\n\n".join(x for x in (line, self.prompt_note(prompt, attention, still=True)) if x)
            h, w, _ = self._text_size(height, width, 1)
            encoder = self._encoder(text_encoder, "text-to-image")
            progress(0, desc="loading models")
            tokens = _prod(video_grid(self.cache, generation.still_frames(self.cache), h, w))
            result = self._timed(family, attention, tokens, batch, steps, guidance, lambda: generation.text_samples(
                self.cache, attention, encoder, given, negative_prompt, batch, seed, steps, guidance, h, w, 1,
                runtime=runtime), runtime)
            stem = f"{files.slug(prompt)[:40]}-{attention}-seed{seed}"
            note = "\n\n".join(x for x in (note, *result.notes) if x)
        folder = files.request_dir(self.output_root, "image")
        downloads, previews = files.save_images(result.samples, folder, stem)
        return previews, downloads, _ms(result.timings), note

    # --- Video -------------------------------------------------------------------------------
    @readable_errors
    def video(self, prompt, negative_prompt, attention, text_encoder, frames, height, width, batch, seed, steps,
              guidance, runtime="eager", rewrite_prompt=True, progress=gr.Progress(track_tqdm=True)):
        """A clip of a prompt, as an MP4, and a note: the prompt the model was given when it was rewritten to
        the model's caption template ("read as: the digit 3 moves left"; ``rewrite_prompt`` False keeps it as
        written), and what in the prompt the models cannot read ("" when neither applies); steps None: the
        page's first value."""
        steps = self.limits.start_steps(False) if steps is None else steps
        prompt = bounded_prompt(prompt, self.limits)
        negative_prompt = bounded_prompt(negative_prompt, self.limits, "negative_prompt")
        attention = self._attention("video", attention)
        encoder = self._encoder(text_encoder, "text-to-video")
        h, w, f = self._text_size(height, width, frames, min_frames=2)   # one frame: the Image tab
        batch = bounded_int("batch", batch, 1, self.limits.max_batch)
        seed, steps, guidance = self._common(seed, steps, guidance)
        runtime = self._runtime(runtime)
        used, line = self.read_as(prompt, attention, _flag("rewrite_prompt", rewrite_prompt))
        progress(0, desc="loading models")
        tokens = _prod(video_grid(self.cache, f, h, w))
        result = self._timed("video", attention, tokens, batch, steps, guidance, lambda: generation.text_samples(
            self.cache, attention, encoder, used, negative_prompt, batch, seed, steps, guidance, h, w, f,
            runtime=runtime), runtime)
        folder = files.request_dir(self.output_root, "video")
        downloads, _ = files.save_videos(result.samples, folder, f"{files.slug(prompt)[:40]}-{attention}-seed{seed}")
        note = "\n\n".join(x for x in (line, self.prompt_note(prompt, attention), self.size_note(attention, f, h, w),
                                       *result.notes) if x)
        return downloads[0], downloads, _ms(result.timings), note

    def read_as(self, prompt, attention, rewrite: bool = True) -> tuple[str, str]:
        """(the prompt the video model behind ``attention`` is given, "read as: ..." or "") (``prompts.read_as``,
        with the template and digit count its card declares)."""
        models = self.cache.models
        return read_as(prompt, caption_template(models, "video", attention), trained_on(models, "video", attention),
                       rewrite)

    def prompt_note(self, prompt, attention, still: bool = False) -> str:
        """What the video model behind ``attention`` cannot read in ``prompt`` (``prompts.prompt_note``; ``still``:
        for a one-frame still, where no direction is asked)."""
        models = self.cache.models
        return prompt_note(prompt, model_name(models, "video", attention), trained_on(models, "video", attention),
                           still)

    def size_note(self, attention, frames: int, height: int, width: int) -> str:
        """A note when the video model behind ``attention`` never trained at this size (``prompts.size_note``)."""
        models = self.cache.models
        return size_note(model_name(models, "video", attention), trained_on(models, "video", attention), frames,
                         height, width)

    def prompt_help(self) -> str:
        """The Video tab's prompt help: what the models read, what the served video models were trained on."""
        models = self.cache.models
        return help_text({model_name(models, "video", a): trained_on(models, "video", a)
                          for a in self.offered("video")})

    # --- Compare -----------------------------------------------------------------------------
    @readable_errors
    def compare(self, task, configs, prompt, class_label, seed, steps=None, guidance=4.0, frames=None, height=None,
                width=None, rewrite_prompt=True, progress=gr.Progress()):
        """The same seed through the reference and the chosen configurations, side by side, with latency
        and quality. steps left out (None): the task's own, as the page starts it (more for text-to-image).
        ``rewrite_prompt``: each model whose card declares a caption template gets the prompt rewritten to it
        (its caption says "read as: ..."); False gives every model the prompt as written."""
        task = _choice("task", task, COMPARE_TASKS)
        steps = self.limits.start_steps(task == "text-to-image") if steps is None else steps
        family = _family(task)
        # class-to-image reads no text, so its labels may name any encoder (ignored there)
        encoders = (self.cache.models.encoders_for(task) if task in TEXT_TASKS
                    else list(self.cache.models.text_encoders))
        if configs is not None and not isinstance(configs, (list, tuple)):
            configs = [configs]
        offered = self.offered(family)
        chosen = [self._config(c, offered, encoders, task) for c in (configs or [])]
        planned = compare.plan(task, chosen)
        if len(planned) > self.limits.max_configs:
            raise rejected(f"configs: {len(planned)} configurations (with the sdpa · FlashAttention reference) is "
                           f"too many: this server compares at most {self.limits.max_configs} at once")
        seed, steps, guidance = self._common(seed, steps, guidance)
        req = compare.CompareRequest(task, planned, seed, steps, guidance)
        if task == "class-to-image":
            num_classes = int(self.cache.base("image").transformer.config.num_embeds_ada_norm)
            req.class_label = bounded_int("class_label", class_label, 0, num_classes - 1)
            tokens = _prod(image_grid(self.cache))
        else:
            req.prompt = bounded_prompt(prompt, self.limits)
            rewrite = _flag("rewrite_prompt", rewrite_prompt)
            req.prompts = {a: self.read_as(req.prompt, a, rewrite) for a in {a for a, _ in planned}}
            video = task == "text-to-video"
            req.height, req.width, req.frames = self._text_size(height, width, frames if video else 1,
                                                                min_frames=2 if video else 1)
            tokens = _prod(video_grid(self.cache, req.frames, req.height, req.width))
        per_pass = TimeBudget.tokens(tokens, 1, guidance)
        self._check_compare_time(family, planned, steps, per_pass)
        rows = compare.compare(self.cache, req, progress)
        for (attention, _), row in zip(planned, rows):
            self.budget.record((family, attention), steps, per_pass, row.get("total_ms", 0.0) / 1e3,
                               row.pop("step_seconds", ()))
            if task == "text-to-video" and (note := self.size_note(attention, req.frames, req.height, req.width)):
                row["size_note"] = note   # a blank clip from a model never trained at this size says why
        return self._compare_outputs(rows, seed)

    def _check_compare_time(self, family, planned, steps, per_pass) -> None:
        """Refuses a comparison whose configurations together would pass the time bound, naming each one's
        estimate (so a user sees what the reference costs beside MHLA) and the steps that would fit.
        Configurations not measured yet add nothing, so the sum is a floor: refused only when even that is past."""
        bound = self.limits.max_request_s
        known = [(compare.config_label(a, e), got) for a, e in planned
                 if (got := self.budget.step_estimate((family, a), per_pass)) is not None]
        total = sum(fixed + steps * per_step for _, (fixed, per_step) in known)
        if bound is None or total <= bound:
            return
        fit = self.budget.steps_that_fit(sum(f for _, (f, _) in known), sum(p for _, (_, p) in known), steps)
        each = ", ".join(f"{label} about {fixed + steps * per_step:.0f} s" for label, (fixed, per_step) in known)
        basis = "; ".join(dict.fromkeys(self.budget.basis((family, a), per_pass) for a, _ in planned))
        fewer = f"steps ≤ {fit}, " if 1 <= fit < steps else "fewer steps, "
        raise rejected(f"steps={steps}: these {len(planned)} configurations would take about {total:.0f} s here "
                       f"({each}; estimated from {basis}), past this server's {bound:.0f} s per request: use "
                       f"{fewer}fewer configurations or a smaller size")

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
            read = row.get("prompt_read_as")
            caption = " · ".join([row["config"]] + ([f"read as: {read}"] if read else [])
                                 + (["not trained at this size"] if row.get("size_note") else [])
                                 + (["prompt cut to the tokens the encoder reads"] if row.get("prompt_note") else []))
            gallery.append((previews[0], caption))
        columns = [c for c in TABLE_COLUMNS if any(c in r for r in rows)]
        table = [[_cell(c, r.get(c)) for c in columns] for r in rows]
        details = [{k: compare.finite(v) for k, v in r.items()} for r in rows]
        return gallery, downloads, {"headers": [TABLE_HEADERS[c] for c in columns], "data": table}, details

    # --- Benchmarks ----------------------------------------------------------------------------
    @readable_errors
    def benchmarks(self, source, series=bench_results.SERIES[0], progress=gr.Progress(track_tqdm=True)):
        source = _choice("source", source, BENCH_SOURCES)
        series = _choice("series", series, bench_results.SERIES)
        if source == "recorded":
            rows = bench_results.read_results(self.results_path)
            title = bench_results.recorded_title(rows)
            note = (f"recorded in `{self.results_path.name}`: the latest measurement of each shape and method, "
                    "plotted as CUDA-graph replay (the kernels' own time)")
        else:
            progress(0, desc="timing attention")
            rows = bench_results.fresh_rows(self.cache.device, shapes=self.bench_shapes)
            kind = self.cache.device.type
            title = f"Attention latency, measured now ({kind})"
            note = (f"measured now on {kind}: `{bench_results.model_path(kind)}` is MHLA as the models run it here; "
                    "each point the median of 3 passes after a warm-up, its bar (and the table) the spread min–max")
        y = bench_results.time_key(rows)
        folder = files.request_dir(self.output_root, "bench")
        plot = bench_results.plot(bench_results.select_series(rows, series, y), folder / "latency.png", y, title)
        table = bench_results.markdown(rows)
        (folder / "latency.md").write_text(table + "\n")
        return plot, f"**{note}**\n\n{table}", [plot, str(folder / "latency.md")]

    def model_latency(self):
        """The recorded sampling time per clip (MHLA beside softmax): the plot and its markdown (the MHLA /
        softmax ratio per token count, the rows, the runs' command, commit and date). A missing or malformed
        file shows as one line in place of the table, with no plot, not as an error."""
        folder = files.request_dir(self.output_root, "bench")
        view = bench_results.model_view(self.model_results_path, folder)
        if "error" in view:
            return None, f"**Sampling time per clip:** {view['error']}"
        return view["plot"], view["text"]

    # --- defaults for the page -----------------------------------------------------------------
    def page_defaults(self) -> dict:
        size = default_video_size(self.cache)
        size["frames"] = max(2, min(size["frames"], self.limits.max_frames))
        g = video_geometry(self.cache)
        for key, stride in (("height", g.stride_h), ("width", g.stride_w)):
            size[key] = min(size[key], self.limits.side_range(stride)[1])
        return {"image_side": image_side(self.cache), **size,
                "num_classes": int(self.cache.base("image").transformer.config.num_embeds_ada_norm),
                "text_encoders": list(self.cache.models.text_encoders),
                # per text task: the encoders offered, and one line on those that are not (the cards' rates)
                "encoders": {task: self.cache.models.encoders_for(task) for task in TEXT_TASKS},
                "encoder_notes": {task: self.cache.models.encoder_note(task) for task in TEXT_TASKS},
                "side_range_h": self.limits.side_range(g.stride_h), "side_range_w": self.limits.side_range(g.stride_w),
                "stride_h": g.stride_h, "stride_w": g.stride_w, "max_seed": MAX_SEED,
                "offered": {family: self.offered(family) for family in ("image", "video")}}


# The Compare table: the quality columns first (reference-free: digit / direction verdicts for
# clips, each beside what the scorer read, the classifier for images), then total and denoising time,
# then agreement with the reference; everything else is in "all numbers". Short headers keep it inside
# its pane.
TABLE_COLUMNS = ("config", "blank", "digit_ok", "digit_read", "direction_ok", "direction_found", "digit_prob",
                 "predicted", "vbench_total", "total_ms", "denoising_ms", "ssim", "psnr_db")
TABLE_HEADERS = {"config": "config", "blank": "blank", "digit_ok": "digit", "digit_read": "read as",
                 "direction_ok": "direction", "direction_found": "moved",
                 "digit_prob": "p(digit)", "predicted": "read as", "vbench_total": "VBench",
                 "total_ms": "total ms", "denoising_ms": "denoise ms", "ssim": "SSIM to ref",
                 "psnr_db": "PSNR to ref"}


def _prod(grid) -> int:
    n = 1
    for g in grid:
        n *= int(g)
    return n


def _cell(column: str, value) -> str:
    """A table cell: times as whole ms with thousands separators, yes/no for verdicts, 3
    significant figures otherwise; the reference's own PSNR is ∞."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value == float("inf"):
            return "∞ (reference)"
        if column.endswith("_ms"):
            return f"{value:,.0f}"
        return f"{value:.3g}"
    return str(value)

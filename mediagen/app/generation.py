"""One generation request, timed per stage: text encoding, denoising (the transformer loop) and
decoding (the autoencoder). Every request gets its own pipeline object and scheduler around the
cached modules, so concurrent requests never share sampling state.

Samples come back as float arrays in [0, 1]: images (B, H, W, C), videos (B, F, H, W, C).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from .sizes import image_grid, video_grid


@dataclass
class Generated:
    samples: np.ndarray
    timings: dict = field(default_factory=dict)   # seconds per stage
    step_seconds: list = field(default_factory=list)   # each denoising step, the first from the stage's start
    notes: list = field(default_factory=list)   # lines for the page about how the request was read

    @property
    def is_video(self) -> bool:
        return self.samples.ndim == 5


class _Clock:
    """Wall time per stage; waits for the GPU so a stage is charged for its own kernels."""

    def __init__(self, device):
        self.device = device
        self.timings: dict[str, float] = {}
        self.step_seconds: list[float] = []
        self._mark = None

    def step_callback(self, on_step=None):
        """A pipeline step-end callback that times each denoising step (for the time estimate,
        ``limits.TimeBudget``) and then calls ``on_step(steps done)`` when given."""
        clock = self

        def callback(pipe, i, t, tensors):
            clock._sync()
            now = time.perf_counter()
            clock.step_seconds.append(now - clock._mark)
            clock._mark = now
            if on_step is not None:
                on_step(i + 1)
            return {}

        return callback

    def stage(self, name: str):
        clock = self

        class _Stage:
            def __enter__(self):
                clock._sync()
                self.t0 = clock._mark = time.perf_counter()

            def __exit__(self, *exc):
                clock._sync()
                clock.timings[name] = clock.timings.get(name, 0.0) + time.perf_counter() - self.t0

        return _Stage()

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _generator(cache, seed: int):
    return torch.Generator(device=cache.device).manual_seed(int(seed))


def class_images(cache, attention: str, class_label: int, batch: int, seed: int, steps: int,
                 guidance: float, on_step=None, runtime: str = "eager") -> Generated:
    """``batch`` images of one class from the class-conditional model; ``runtime``: how the denoising
    loop runs the transformer (``mediagen.pipelines.runtime``)."""
    from ..pipelines.class_image import ClassConditionalImagePipeline
    from ..pipelines.vae_utils import latents_to_vae, vae_dtype

    clock = _Clock(cache.device)
    pipe = ClassConditionalImagePipeline(transformer=cache.transformer("image", attention, image_grid(cache)),
                                         scheduler=cache.scheduler("image", attention), vae=cache.vae("image"))
    pipe.set_runtime(runtime)
    clock.timings["text_encoding"] = 0.0
    with clock.stage("denoising"):
        latents = pipe(class_labels=[int(class_label)] * batch, guidance_scale=guidance, num_inference_steps=steps,
                       generator=_generator(cache, seed), output_type="latent",
                       callback_on_step_end=clock.step_callback(on_step)).images
    with clock.stage("decoding"), torch.no_grad():
        z = latents_to_vae(pipe.vae, latents.to(vae_dtype(pipe.vae)))
        images = pipe.image_processor.postprocess(pipe.vae.decode(z, return_dict=False)[0].float(), output_type="np")
    return Generated(np.asarray(images, dtype=np.float32), clock.timings, clock.step_seconds)


# Text states are padded (with zeros) to the length the text models are trained and sampled with, the
# pipelines' max_sequence_length: their cross-attention attends to the padding too, so states cut to
# the prompt's own length change what they draw (the asked digit was read in 5 of 12 clips instead of 12).
TEXT_LENGTH = 64


def encode_prompt(cache, encoder_label: str, prompt: str, negative_prompt: str | None, guidance: float):
    """(prompt embeds, negative embeds or None, notes) from the chosen text encoder, padded to TEXT_LENGTH.
    A prompt of more tokens is cut to TEXT_LENGTH; ``notes`` says so (one line per prompt cut), since the
    encoder's own warning reaches only the server's log and the user would not know the end was unread."""
    encoder = cache.text_encoder(encoder_label)
    notes = []
    with cache.encoder_lock(encoder_label):
        embeds, _ = encoder.encode([prompt], max_length=TEXT_LENGTH, padding="max_length")
        notes.append(_length_note(encoder, prompt, "prompt"))
        negative = None
        if guidance > 1.0:
            negative, _ = encoder.encode([negative_prompt or ""], max_length=TEXT_LENGTH, padding="max_length")
            notes.append(_length_note(encoder, negative_prompt, "negative_prompt"))
    return embeds, negative, [n for n in notes if n]


def _length_note(encoder, prompt: str | None, name: str) -> str:
    """A line when ``prompt`` has more tokens than TEXT_LENGTH (the encoder reads only those); "" otherwise."""
    n = len(encoder.tokenizer(prompt or "", add_special_tokens=True, verbose=False)["input_ids"])
    if n <= TEXT_LENGTH:
        return ""
    return (f"The {name} is {n} tokens long; the text encoder reads its first {TEXT_LENGTH} tokens, so the rest of "
            "it is not read: shorten it.")


def text_samples(cache, attention: str, encoder_label: str, prompt: str, negative_prompt: str | None, batch: int,
                 seed: int, steps: int, guidance: float, height: int, width: int, frames: int,
                 on_step=None, runtime: str = "eager") -> Generated:
    """Videos (frames > 1) or images (frames == 1, returned as (B, H, W, C)) from the text model. An
    image is the middle frame of a clip of ``still_frames(cache)`` frames: the text model is trained on
    clips, and draws a far clearer still that way than on a one-frame grid (docs/RESULTS.md)."""
    from ..pipelines.text_video import TextToVideoPipeline

    image = frames == 1
    frames = still_frames(cache) if image else frames
    clock = _Clock(cache.device)
    transformer = cache.transformer("video", attention, video_grid(cache, frames, height, width))
    pipe = TextToVideoPipeline(transformer=transformer, scheduler=cache.scheduler("video", attention),
                               vae=cache.vae("video"))
    pipe.check_size(height, width, frames)
    pipe.set_runtime(runtime)
    cache.text_encoder(encoder_label)                        # loaded (once) outside the timed stage
    with clock.stage("text_encoding"):
        embeds, negative, notes = encode_prompt(cache, encoder_label, prompt, negative_prompt, guidance)
    with clock.stage("denoising"):
        latents = pipe(prompt_embeds=embeds, negative_prompt_embeds=negative, height=height, width=width,
                       num_frames=frames, num_inference_steps=steps, guidance_scale=guidance,
                       num_videos_per_prompt=batch, generator=_generator(cache, seed), output_type="latent",
                       callback_on_step_end=clock.step_callback(on_step)).frames
    with clock.stage("decoding"), torch.no_grad():
        videos = np.asarray(pipe.decode(latents, "np"), dtype=np.float32)
    return Generated(videos[:, frames // 2] if image else videos, clock.timings, clock.step_seconds, notes)


def still_frames(cache) -> int:
    """Frames of the clip a prompt-mode image is drawn from: the clip length the text model was trained
    on (its default size), 1 when that is not known."""
    return int(cache.models.video.size.get("frames", 1))

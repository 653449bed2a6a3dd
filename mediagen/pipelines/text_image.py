"""Text-to-image: the text-to-video pipeline run for a single frame (a Wan-style transformer sees
an image as a one-frame video), returning images. A model trained on clips alone (the shipped video
models) draws a clearer still as the middle frame of a clip (``num_frames`` > 1) than on a one-frame grid
it never saw (docs/RESULTS.md, text-to-video)."""

from __future__ import annotations

import torch

from .outputs import ImagePipelineOutput
from .text_video import TextToVideoPipeline


class TextToImagePipeline(TextToVideoPipeline):
    @torch.no_grad()
    def __call__(self, prompt=None, negative_prompt=None, height: int = 64, width: int = 64,
                 num_inference_steps: int = 30, guidance_scale: float = 5.0, num_images_per_prompt: int = 1,
                 generator=None, latents=None, prompt_embeds=None, negative_prompt_embeds=None,
                 output_type: str = "pil", return_dict: bool = True, callback_on_step_end=None,
                 callback_on_step_end_tensor_inputs=("latents",), attention_kwargs=None,
                 max_sequence_length: int = 64, num_frames: int = 1, rewrite_prompt: bool | None = None):
        """Images: PIL list, np (B, H, W, C) in [0, 1], torch (B, C, H, W), or latents (B, C, 1, h, w).
        ``num_frames`` > 1 draws a clip of that many frames and returns its middle frame. ``rewrite_prompt``: as
        for ``TextToVideoPipeline`` (a prompt without a direction becomes the still form, "the digit 7")."""
        if latents is not None and latents.dim() == 4:
            if num_frames != 1:
                raise ValueError(f"num_frames={num_frames} is not allowed with 4-D latents (one frame): use "
                                 "num_frames=1 or pass (B, C, F, h, w) latents")
            latents = latents.unsqueeze(2)
        frames = super().__call__(
            prompt=prompt, negative_prompt=negative_prompt, height=height, width=width, num_frames=num_frames,
            num_inference_steps=num_inference_steps, guidance_scale=guidance_scale,
            num_videos_per_prompt=num_images_per_prompt, generator=generator, latents=latents,
            prompt_embeds=prompt_embeds, negative_prompt_embeds=negative_prompt_embeds, output_type=output_type,
            return_dict=False, callback_on_step_end=callback_on_step_end,
            callback_on_step_end_tensor_inputs=callback_on_step_end_tensor_inputs,
            attention_kwargs=attention_kwargs, max_sequence_length=max_sequence_length,
            rewrite_prompt=rewrite_prompt)[0]
        mid = num_frames // 2
        if output_type == "pil":
            images = [video[mid] for video in frames]
        elif output_type == "latent":
            images = frames[:, :, mid:mid + 1]
        else:
            images = frames[:, mid]
        return ImagePipelineOutput(images=images) if return_dict else (images,)

"""Text-to-video with a Wan-style transformer (``WanTransformer3DModel``, stock or converted).

Components: transformer, scheduler, vae (``IdentityAutoencoder`` for pixel-space models or
``AutoencoderKLWan``), text_encoder and an optional tokenizer (see ``prompt_encoding``). For the
real Wan2.1 checkpoints diffusers' own ``WanPipeline`` serves unchanged after ``mediagen.convert``.

Config (saved in model_index.json, as diffusers saves a pipeline's own settings): ``caption_template``, the
caption template the model was trained on ("the digit {d} moves {m}"; None: trained on free wording), and
``caption_digits``, the most digits its training clips held. A pipeline with a template rewrites each prompt
to it before encoding unless the call says ``rewrite_prompt=False`` (``prompts.rewrite_prompt``): a model
trained on one template draws the asked digit far less often from other wordings.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers import DiffusionPipeline
from diffusers.utils.torch_utils import randn_tensor
from diffusers.video_processor import VideoProcessor

from . import components  # noqa: F401  (see components.py)
from .checks import check_callback_inputs, check_multiple, check_output_type, check_positive_int
from .denoise import guided, run_denoising, scale_input
from .outputs import VideoPipelineOutput
from .prompt_encoding import as_prompt_list, encode_prompts
from .prompts import renderer
from .prompts import rewrite_prompt as rewrite_prompt_to
from .runtime import RuntimeMixin
from .vae_utils import latents_to_vae, vae_dtype, vae_factors


class TextToVideoPipeline(RuntimeMixin, DiffusionPipeline):
    model_cpu_offload_seq = "text_encoder->transformer->vae"
    _optional_components = ["text_encoder", "tokenizer"]
    _callback_tensor_inputs = ["latents", "prompt_embeds", "negative_prompt_embeds"]

    def __init__(self, transformer, scheduler, vae, text_encoder=None, tokenizer=None,
                 caption_template: str | None = None, caption_digits: int | None = None):
        super().__init__()
        self.register_modules(transformer=transformer, scheduler=scheduler, vae=vae, text_encoder=text_encoder,
                              tokenizer=tokenizer)
        if caption_template is not None:
            renderer(caption_template)                 # refused at load time, not at the first prompt
        self.register_to_config(caption_template=caption_template, caption_digits=caption_digits)
        self.video_processor = VideoProcessor(vae_scale_factor=vae_factors(vae)[1])

    def enable_sequence_parallel(self, group=None):
        """Share each video's tokens over the processes of ``group`` (torch.distributed, all of them
        by default): every process calls the pipeline with the same arguments and seed and gets the
        whole video; self-attention exchanges only MHLA block summaries. Needs MHLA in every layer
        (``mediagen.models.sequence_parallel``); returns the hook handles."""
        from ..models.sequence_parallel import enable_sequence_parallel

        return enable_sequence_parallel(self.transformer, group)

    # --- text ------------------------------------------------------------------------------
    def prompt_for_model(self, prompt: str, rewrite_prompt: bool | None = None) -> tuple[str, str]:
        """(the prompt the text encoder gets, why): ``prompt`` rewritten to the config's caption template
        (``prompts.rewrite_prompt``) when ``rewrite_prompt`` is True, or None and the pipeline has a
        template; else unchanged."""
        template = getattr(self.config, "caption_template", None)
        if rewrite_prompt is False or (rewrite_prompt is None and template is None):
            return prompt, "as written: prompt rewriting is off"
        if template is None:
            raise ValueError("rewrite_prompt=True needs a pipeline with a caption_template (the template its model "
                             "was trained on); this one has none")
        return rewrite_prompt_to(prompt, template, getattr(self.config, "caption_digits", None))

    def encode_prompt(self, prompt=None, negative_prompt=None, do_classifier_free_guidance=True,
                      num_videos_per_prompt=1, prompt_embeds=None, negative_prompt_embeds=None,
                      max_sequence_length=64, device=None, dtype=None):
        """(prompt_embeds, negative_prompt_embeds or None), each (B * num_videos_per_prompt, L, C).

        The hook for any text encoder: override this, or give the encoder ``encode_text``.
        """
        device = device or self._execution_device
        dtype = dtype or self.transformer.dtype
        if prompt_embeds is None:
            if prompt is None:
                raise ValueError("give prompt or prompt_embeds")
            prompts = as_prompt_list(prompt, "prompt")
            prompt_embeds, _ = encode_prompts(self.text_encoder, self.tokenizer, prompts, max_sequence_length,
                                              device, dtype)
        prompt_embeds = prompt_embeds.to(device=device, dtype=dtype)
        if do_classifier_free_guidance and negative_prompt_embeds is None:
            negs = as_prompt_list(negative_prompt if negative_prompt is not None else "", "negative_prompt")
            if len(negs) == 1:
                negs = negs * (prompt_embeds.shape[0])
            if len(negs) != prompt_embeds.shape[0]:
                raise ValueError(f"negative_prompt has {len(negs)} entries for {prompt_embeds.shape[0]} prompts")
            if self.text_encoder is None:
                negative_prompt_embeds = torch.zeros_like(prompt_embeds)
            else:
                negative_prompt_embeds, _ = encode_prompts(self.text_encoder, self.tokenizer, negs,
                                                           prompt_embeds.shape[1], device, dtype)
        if negative_prompt_embeds is not None:
            negative_prompt_embeds = negative_prompt_embeds.to(device=device, dtype=dtype)
            if negative_prompt_embeds.shape[0] != prompt_embeds.shape[0]:
                raise ValueError(f"negative_prompt_embeds has batch {negative_prompt_embeds.shape[0]}, "
                                 f"prompt_embeds {prompt_embeds.shape[0]}: they must match")
            # one batch for guidance needs one length: zero-pad the shorter (padding is zeros anyway)
            length = max(prompt_embeds.shape[1], negative_prompt_embeds.shape[1])
            prompt_embeds = F.pad(prompt_embeds, (0, 0, 0, length - prompt_embeds.shape[1]))
            negative_prompt_embeds = F.pad(negative_prompt_embeds, (0, 0, 0, length - negative_prompt_embeds.shape[1]))
        rep = num_videos_per_prompt
        prompt_embeds = prompt_embeds.repeat_interleave(rep, dim=0)
        if negative_prompt_embeds is not None:
            negative_prompt_embeds = negative_prompt_embeds.repeat_interleave(rep, dim=0)
        return prompt_embeds, negative_prompt_embeds

    # --- shapes ----------------------------------------------------------------------------
    def check_size(self, height, width, num_frames):
        t, s = vae_factors(self.vae)
        p_t, p_h, p_w = self.transformer.config.patch_size
        check_multiple("height", height, s * p_h, f"autoencoder factor {s} x patch {p_h}")
        check_multiple("width", width, s * p_w, f"autoencoder factor {s} x patch {p_w}")
        check_positive_int("num_frames", num_frames)
        if (num_frames - 1) % t:
            raise ValueError(f"num_frames={num_frames} is not allowed: with temporal factor {t} it must be "
                             f"{t}k + 1 (e.g. {t * ((num_frames - 1) // t) + 1})")
        latent_frames = (num_frames - 1) // t + 1
        if latent_frames % p_t:
            raise ValueError(f"num_frames={num_frames} gives {latent_frames} latent frames, not a multiple of "
                             f"the temporal patch {p_t}")
        return latent_frames, height // s, width // s

    def prepare_latents(self, batch, latent_size, generator, device, latents=None):
        shape = (batch, self.transformer.config.in_channels, *latent_size)
        if latents is not None:
            if tuple(latents.shape) != shape:
                raise ValueError(f"latents has shape {tuple(latents.shape)}; expected {shape}")
            noise = latents.to(device=device, dtype=torch.float32)
        else:
            if isinstance(generator, list) and len(generator) != batch:
                raise ValueError(f"generator is a list of {len(generator)}; it needs one per sample ({batch})")
            noise = randn_tensor(shape, generator=generator, device=device, dtype=torch.float32)
        # given latents are unit noise, as in diffusers' pipelines: scaled like the noise drawn here
        return noise * getattr(self.scheduler, "init_noise_sigma", 1.0)

    def decode(self, latents, output_type):
        if output_type == "latent":
            return latents
        z = latents_to_vae(self.vae, latents.to(vae_dtype(self.vae)))
        video = self.vae.decode(z, return_dict=False)[0]
        return self.video_processor.postprocess_video(video.float(), output_type=output_type)

    @property
    def guidance_scale(self):
        return self._guidance_scale

    @property
    def num_timesteps(self):
        return self._num_timesteps

    @property
    def interrupt(self):
        return self._interrupt

    # --- sampling --------------------------------------------------------------------------
    @torch.no_grad()
    def __call__(self, prompt=None, negative_prompt=None, height: int = 64, width: int = 64, num_frames: int = 16,
                 num_inference_steps: int = 30, guidance_scale: float = 5.0, num_videos_per_prompt: int = 1,
                 generator=None, latents=None, prompt_embeds=None, negative_prompt_embeds=None,
                 output_type: str = "np", return_dict: bool = True, callback_on_step_end=None,
                 callback_on_step_end_tensor_inputs=("latents",), attention_kwargs=None,
                 max_sequence_length: int = 64, rewrite_prompt: bool | None = None):
        """``rewrite_prompt``: render each prompt in the model's caption template first (``prompt_for_model``);
        None follows the pipeline's config (on when it has a ``caption_template``), False keeps the prompts
        as written. Prompt embeddings passed in are used as given."""
        check_output_type(output_type)
        check_positive_int("num_inference_steps", num_inference_steps)
        check_positive_int("num_videos_per_prompt", num_videos_per_prompt)
        check_callback_inputs(callback_on_step_end_tensor_inputs, self._callback_tensor_inputs)
        latent_size = self.check_size(height, width, num_frames)
        device = self._execution_device
        self._guidance_scale = guidance_scale
        do_cfg = guidance_scale > 1.0
        if prompt is not None and prompt_embeds is None:
            prompt = [self.prompt_for_model(p, rewrite_prompt)[0] for p in as_prompt_list(prompt, "prompt")]
        prompt_embeds, negative_prompt_embeds = self.encode_prompt(
            prompt, negative_prompt, do_cfg, num_videos_per_prompt, prompt_embeds, negative_prompt_embeds,
            max_sequence_length, device)
        batch = prompt_embeds.shape[0]
        latents = self.prepare_latents(batch, latent_size, generator, device, latents)
        dtype = self.transformer.dtype

        def predict(x, t, state):
            context = state["prompt_embeds"]
            if do_cfg:
                x = torch.cat([x, x])
                context = torch.cat([state["negative_prompt_embeds"], context])
            x = scale_input(self.scheduler, x, t)
            timestep = t.expand(x.shape[0]).to(device)
            pred = self.call_transformer(hidden_states=x.to(dtype), timestep=timestep, encoder_hidden_states=context,
                                         attention_kwargs=attention_kwargs, return_dict=False)[0].float()
            return guided(pred, guidance_scale) if do_cfg else pred

        state = {"prompt_embeds": prompt_embeds, "negative_prompt_embeds": negative_prompt_embeds}
        latents = run_denoising(self, latents, predict, num_inference_steps, device, state,
                                callback_on_step_end, callback_on_step_end_tensor_inputs)
        frames = self.decode(latents, output_type)
        self.maybe_free_model_hooks()
        return VideoPipelineOutput(frames=frames) if return_dict else (frames,)

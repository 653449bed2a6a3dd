"""Class-conditional image generation with a DiT (``DiTTransformer2DModel``, stock or converted).

Like diffusers' ``DiTPipeline`` but not tied to ImageNet: the null class for guidance is
``num_embeds_ada_norm`` (DiT's label table has one extra row), any class count works, and both
flow-matching (velocity) and DDPM-style (noise) schedulers run it. A transformer with learned
sigma (out_channels = 2 x in_channels) has its variance half dropped, as DiT samples.
"""

from __future__ import annotations

import torch
from diffusers import DiffusionPipeline
from diffusers.image_processor import VaeImageProcessor
from diffusers.utils.torch_utils import randn_tensor

from . import components  # noqa: F401  (see components.py)
from .checks import check_callback_inputs, check_multiple, check_output_type, check_positive_int
from .denoise import guided, run_denoising, scale_input
from .outputs import ImagePipelineOutput
from .runtime import RuntimeMixin
from .vae_utils import latents_to_vae, vae_dtype, vae_factors


class ClassConditionalImagePipeline(RuntimeMixin, DiffusionPipeline):
    model_cpu_offload_seq = "transformer->vae"
    _callback_tensor_inputs = ["latents"]

    def __init__(self, transformer, scheduler, vae):
        super().__init__()
        self.register_modules(transformer=transformer, scheduler=scheduler, vae=vae)
        self.image_processor = VaeImageProcessor(vae_scale_factor=vae_factors(vae)[1])

    @property
    def num_classes(self) -> int:
        return int(self.transformer.config.num_embeds_ada_norm)

    def check_labels(self, class_labels) -> list[int]:
        """The class indices as Python ints. Labels may be ints of any integer type (numpy's, a 0-d or 1-d integer
        tensor or array, as diffusers' DiTPipeline takes them); one label or a sequence of them."""
        if getattr(class_labels, "ndim", None) == 0 or isinstance(class_labels, (int, str, bytes)) \
                or not hasattr(class_labels, "__iter__"):
            labels = [class_labels]
        else:
            labels = list(class_labels)
        if not labels:
            raise ValueError("class_labels is empty: give at least one class index")
        out = []
        for c in labels:
            value = _as_scalar(c)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < self.num_classes:
                raise ValueError(f"class_labels contains {c!r}: class indices run from 0 to {self.num_classes - 1}, "
                                 f"as ints")
            out.append(value)
        return out

    def default_size(self) -> int:
        return self.transformer.config.sample_size * vae_factors(self.vae)[1]

    @torch.no_grad()
    def __call__(self, class_labels, guidance_scale: float = 4.0, num_inference_steps: int = 50,
                 height: int | None = None, width: int | None = None, generator=None, latents=None,
                 output_type: str = "pil", return_dict: bool = True, callback_on_step_end=None,
                 callback_on_step_end_tensor_inputs=("latents",)):
        check_output_type(output_type)
        check_positive_int("num_inference_steps", num_inference_steps)
        check_callback_inputs(callback_on_step_end_tensor_inputs, self._callback_tensor_inputs)
        labels = self.check_labels(class_labels)
        height = height or self.default_size()
        width = width or self.default_size()
        s, p = vae_factors(self.vae)[1], self.transformer.config.patch_size
        check_multiple("height", height, s * p, f"autoencoder factor {s} x patch {p}")
        check_multiple("width", width, s * p, f"autoencoder factor {s} x patch {p}")
        if height != width:
            raise ValueError(f"height={height} and width={width} must be equal: DiT un-patchifies square grids only")
        device = self._execution_device
        channels = self.transformer.config.in_channels
        shape = (len(labels), channels, height // s, width // s)
        if latents is None:
            latents = randn_tensor(shape, generator=generator, device=device, dtype=torch.float32)
        elif tuple(latents.shape) != shape:
            raise ValueError(f"latents has shape {tuple(latents.shape)}; expected {shape}")
        latents = latents.to(device=device, dtype=torch.float32) * getattr(self.scheduler, "init_noise_sigma", 1.0)
        do_cfg = guidance_scale > 1.0
        y = torch.tensor(labels, device=device)
        if do_cfg:
            y = torch.cat([torch.full_like(y, self.num_classes), y])
        dtype = self.transformer.dtype
        self._guidance_scale = guidance_scale

        def predict(x, t, state):
            x = torch.cat([x, x]) if do_cfg else x
            x = scale_input(self.scheduler, x, t)
            timestep = t.expand(x.shape[0]).to(device)
            pred = self.call_transformer(x.to(dtype), timestep=timestep, class_labels=y,
                                         return_dict=False)[0].float()
            if pred.shape[1] == 2 * channels:  # learned sigma: keep the mean prediction
                pred = pred[:, :channels]
            return guided(pred, guidance_scale) if do_cfg else pred

        latents = run_denoising(self, latents, predict, num_inference_steps, device, {},
                                callback_on_step_end, callback_on_step_end_tensor_inputs)
        if output_type == "latent":
            images = latents
        else:
            z = latents_to_vae(self.vae, latents.to(vae_dtype(self.vae)))
            images = self.image_processor.postprocess(self.vae.decode(z, return_dict=False)[0].float(),
                                                      output_type=output_type)
        self.maybe_free_model_hooks()
        return ImagePipelineOutput(images=images) if return_dict else (images,)


def _as_scalar(x):
    """A 0-d tensor or array, or a numpy scalar, as the Python number it holds (``.item()``); anything else as is."""
    if getattr(x, "ndim", None) == 0 and hasattr(x, "item"):
        return x.item()
    return x

"""vLLM-Omni FLUX.1-Kontext pipeline that samples with the Flow-GRPO SDE step and records log-probs.

Named by ``FluxKontextTrainingAdapter.rollout_pipeline``; vLLM-Omni loads it as the custom pipeline of a
``FluxKontextPipeline`` checkpoint. It keeps vLLM-Omni's text encoding (CLIP pooled, T5 tokens), VAE encoding
of the source image, packed latents and denoising loop (``diffuse``: the source image's tokens appended to
the noise tokens, the first ``S`` output tokens kept, one pass per step with the guidance embedding), run
inside ``recorder.recording(self)`` so each scheduler step is the recorder's. The schedule is FLUX.1's
(linear σ with the resolution-dependent shift of the noise tokens' count), which vLLM-Omni's Kontext
``forward`` sets inline: the rollout takes it from vLLM-Omni's ``FluxPipeline.prepare_timesteps``.

The source image arrives in the request's multimodal input (:class:`~verl_omni.pipelines.diffusers_rollout.EditRolloutMixin`),
one per request, and is conditioned at its own size with the sides floored to the latent multiple (vLLM-Omni's
Kontext; diffusers' auto-resize to a preferred Kontext resolution is not applied) or, with
``model_kwargs.condition_area``, at that many pixels at its aspect ratio. It is encoded once for the request's
N samples. Recorded per request, beside the trajectory: ``prompt_embeds`` ``[T, D]``,
``pooled_prompt_embeds`` ``[D]``, ``image_latents`` ``[S_c, 4C]`` and ``image_latents_grid`` ``[1, 2]`` (the
source tokens' packed rows, columns: their position ids). Requests whose images condition at different sizes
are denoised as separate transformer batches.
"""

from __future__ import annotations

import torch
from vllm_omni.diffusion.data import DiffusionOutput
from vllm_omni.diffusion.models.flux.pipeline_flux import FluxPipeline
from vllm_omni.diffusion.models.flux.pipeline_flux_kontext import FluxKontextPipeline

from verl_omni.pipelines.diffusers_rollout import EditRolloutMixin
from verl_omni.pipelines.flux.rollout_pipeline import decode, embedded_guidance, prompt_conditioning
from verl_omni.pipelines.flux_kontext.training_adapter import SOURCE_POSITION_INDEX
from verl_omni.pipelines.recorder import RolloutRecorder
from verl_omni.pipelines.rollout_request import RolloutRequest, condition_size
from verl_omni.pipelines.sampling import SamplingSpec


class FluxKontextLogProbPipeline(EditRolloutMixin, FluxKontextPipeline):
    """FLUX.1-Kontext rollout pipeline: token ids and one source image in; images, SDE trajectories, log-probs out."""

    # FLUX.1's schedule, which vLLM-Omni's Kontext forward computes inline
    prepare_timesteps = FluxPipeline.prepare_timesteps

    def condition_size(self, image, spec: SamplingSpec) -> tuple[int, int]:
        """The image's own size floored to the latent multiple, or ``model_kwargs.condition_area`` pixels."""
        multiple = 2 * self.vae_scale_factor
        area = spec.model_kwargs.get("condition_area")
        if area is not None:
            return condition_size(*image.size, float(area), multiple)
        return max(multiple, image.width // multiple * multiple), max(multiple, image.height // multiple * multiple)

    def source_latents(self, sources: list[list], sizes: tuple, dtype: torch.dtype) -> torch.Tensor:
        """Packed VAE latents ``[R, S_c, 4C]`` of each request's source image at ``sizes``, as vLLM-Omni's
        ``prepare_latents`` encodes them (the latent distribution's mode)."""
        ((width, height),) = sizes
        images = [self.resized(images, sizes)[0] for images in sources]
        pixels = self.image_processor.preprocess(images, height, width).to(self._execution_device, dtype)
        latents = self._encode_vae_image(pixels.to(self.vae.dtype), None).to(dtype)
        return self._pack_latents(latents, len(images), latents.shape[1], latents.shape[2], latents.shape[3])

    def denoise_edits(
        self, requests: list[RolloutRequest], sources: list[list], sizes: tuple, spec: SamplingSpec
    ) -> list[DiffusionOutput]:
        # 1. Conditioning of each request (once for its samples): the prompt and the source image's tokens.
        cond, text_ids = prompt_conditioning(self, requests, spec)
        dtype = cond["prompt_embeds"].dtype
        cond["image_latents"] = self.source_latents(sources, sizes, dtype)
        ((width, height),) = sizes
        grid = (height // self.vae_scale_factor // 2, width // self.vae_scale_factor // 2)
        cond["image_latents_grid"] = torch.tensor([[grid]] * len(requests), device=self._execution_device)
        cond = {k: self.per_sample(v, requests) for k, v in cond.items()}

        # 2. Per-sample noise, the schedule; position ids: the generated image's, then the source image's.
        recorder = RolloutRecorder(requests, self._execution_device)
        channels = self.transformer.in_channels // 4
        latents, _, latent_ids, _ = self.prepare_latents(
            None,
            recorder.num_samples,
            channels,
            spec.height,
            spec.width,
            dtype,
            self._execution_device,
            recorder.generators,
        )
        source_ids = self._prepare_latent_image_ids(*grid, self._execution_device, latent_ids.dtype)
        source_ids[:, 0] = SOURCE_POSITION_INDEX
        self.start_schedule(recorder, spec, latents.shape[1], latents.device)
        guidance = embedded_guidance(self, spec, latents.shape[0], latents.device)

        # 3. Denoise: the stock loop (source tokens appended, first S output tokens kept), the recorder's step.
        with recorder.recording(self):
            latents = self.diffuse(
                prompt_embeds=cond["prompt_embeds"],
                pooled_prompt_embeds=cond["pooled_prompt_embeds"],
                negative_prompt_embeds=None,
                negative_pooled_prompt_embeds=None,
                latents=latents,
                image_latents=cond["image_latents"],
                latent_ids=torch.cat([latent_ids, source_ids]),
                text_ids=text_ids,
                negative_text_ids=None,
                timesteps=recorder.loop_timesteps,
                do_true_cfg=False,
                guidance=guidance,
                true_cfg_scale=1.0,
            )
        return self.rollout_outputs(recorder, decode(self, latents, spec), cond, packed=True)

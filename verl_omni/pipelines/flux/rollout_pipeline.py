"""vLLM-Omni FLUX.1 pipeline that samples with the Flow-GRPO SDE step and records log-probs.

Named by ``FluxTrainingAdapter.rollout_pipeline``; vLLM-Omni loads it as the custom pipeline of a
``FluxPipeline`` checkpoint. It keeps vLLM-Omni's text encoding (CLIP pooled, T5 tokens), packed
latents, schedule (linear σ with the resolution-dependent shift) and denoising loop (``diffuse``,
one pass per step with the guidance embedding), run inside ``recorder.recording(self)`` so each
scheduler step is the recorder's. ``forward`` is overridden only to take token ids, give every
sample its own seed, and return images and trajectories (:mod:`verl_omni.pipelines.diffusers_rollout`).

FLUX.1-dev is guidance-distilled: the spec's ``guidance_scale`` (default 3.5) is embedded, no
negative prompt is encoded (the sampling spec refuses ``true_cfg_scale > 1`` for it). The prompt ids
are CLIP's (the adapter's ``tokenizer``); the text they decode to is what CLIP and T5 read. Recorded
per sample: ``prompt_embeds`` ``[T, D]`` and ``pooled_prompt_embeds``; the latents are FLUX's own
packed ``[S, 4C]`` tokens.
"""

from __future__ import annotations

import torch
from vllm_omni.diffusion.models.flux.pipeline_flux import FluxPipeline

from verl_omni.pipelines.diffusers_rollout import DiffusersRolloutMixin
from verl_omni.pipelines.recorder import RolloutRecorder

# T5 tokens per prompt, the stock pipeline's default
MAX_SEQUENCE_LENGTH = 512


class FluxLogProbPipeline(DiffusersRolloutMixin, FluxPipeline):
    """FLUX.1 rollout pipeline: token ids in; images, SDE trajectories and log-probs out."""

    def rollout_forward(self, req):
        requests, spec = self.start_batch(req)
        if spec.uses_cfg:
            raise ValueError(f"FLUX.1 is guidance-distilled: true_cfg_scale={spec.true_cfg_scale} must be <= 1")
        texts = self.prompt_texts(self.tokenizer, requests)
        embeds, pooled, text_ids = self.encode_prompt(texts, None, max_sequence_length=MAX_SEQUENCE_LENGTH)
        cond = {"prompt_embeds": embeds, "pooled_prompt_embeds": pooled}
        cond = {k: self.per_sample(v, requests) for k, v in cond.items()}

        recorder = RolloutRecorder(requests, self.device)
        latents, image_ids = self.prepare_latents(
            recorder.num_samples,
            self.transformer.in_channels // 4,
            spec.height,
            spec.width,
            embeds.dtype,
            self.device,
            recorder.generators,
        )
        self.start_schedule(recorder, spec, latents.shape[1], latents.device)
        self._guidance_scale, self._joint_attention_kwargs = spec.guidance_scale, {}
        guidance = None
        if self.transformer.guidance_embeds:
            guidance = torch.full([latents.shape[0]], float(spec.guidance_scale), dtype=torch.float32)
        with recorder.recording(self):
            latents = self.diffuse(
                cond["prompt_embeds"],
                cond["pooled_prompt_embeds"],
                None,
                None,
                latents,
                image_ids,
                text_ids,
                None,
                recorder.loop_timesteps,
                False,
                guidance,
                1.0,
                cfg_normalize=False,
            )
        self._current_timestep = None
        images = self._unpack_latents(latents, spec.height, spec.width, self.vae_scale_factor)
        images = images / self.vae.config.scaling_factor + self.vae.config.shift_factor
        images = self.vae.decode(images.to(self.vae.dtype), return_dict=False)[0]
        return self.rollout_outputs(recorder, images, cond, packed=True)

"""vLLM-Omni SD3 / SD3.5 pipeline that samples with the Flow-GRPO SDE step and records log-probs.

Named by ``SD3TrainingAdapter.rollout_pipeline``; vLLM-Omni loads it as the custom pipeline of a
``StableDiffusion3Pipeline`` checkpoint. It keeps vLLM-Omni's text encoding (CLIP-L, CLIP-G, T5),
latents, schedule and denoising loop (``diffuse``: classic CFG through ``CFGParallelMixin``) and
runs that loop inside ``recorder.recording(self)``, so each scheduler step is the recorder's
(SDE in a sample's window, exact Euler outside). ``forward`` is overridden only to take token ids,
give every sample its own seed, and return images and trajectories
(:mod:`verl_omni.pipelines.diffusers_rollout`).

The prompt ids are CLIP-L's (the adapter's ``tokenizer``); the text they decode to is what the
three encoders read. Recorded per sample: ``prompt_embeds`` ``[77 + T, D]``, ``pooled_prompt_embeds``
and, with CFG (``true_cfg_scale > 1``, the empty negative prompt unless one is sent), the negatives.
"""

from __future__ import annotations

import torch
from vllm_omni.diffusion.models.sd3.pipeline_sd3 import StableDiffusion3Pipeline

from verl_omni.pipelines.diffusers_rollout import DiffusersRolloutMixin
from verl_omni.pipelines.recorder import RolloutRecorder
from verl_omni.pipelines.rollout_request import RolloutRequest

# T5 tokens per prompt, the stock pipeline's default
MAX_SEQUENCE_LENGTH = 256


class SD3LogProbPipeline(DiffusersRolloutMixin, StableDiffusion3Pipeline):
    """SD3 rollout pipeline: token ids in; images, SDE trajectories and log-probs out."""

    def conditioning(self, requests: list[RolloutRequest], negative: bool) -> dict[str, torch.Tensor]:
        """The three text encoders' embeddings of each request's prompt text (the CLIP-L ids decoded), per sample."""
        texts = self.prompt_texts(self.tokenizer, requests, negative=negative)
        embeds, pooled = self.encode_prompt(texts, None, None, max_sequence_length=MAX_SEQUENCE_LENGTH)
        prefix = "negative_" if negative else ""
        cond = {f"{prefix}prompt_embeds": embeds, f"{prefix}pooled_prompt_embeds": pooled}
        return {k: self.per_sample(v, requests) for k, v in cond.items()}

    def rollout_forward(self, req):
        requests, spec, cond = self.conditioned_batch(req)

        recorder = RolloutRecorder(requests, self.device)
        latents = self.prepare_latents(
            recorder.num_samples, self.transformer.in_channels, spec.height, spec.width, recorder.generators
        )
        # the packed token count S, as diffusers' SD3 pipeline computes the shift (the stock forward passes
        # the channel count; it matters only for a dynamic-shift scheduler config)
        image_seq_len = (latents.shape[2] // self.patch_size) * (latents.shape[3] // self.patch_size)
        self.start_schedule(recorder, spec, image_seq_len, latents.device)
        self._guidance_scale = spec.true_cfg_scale
        with recorder.recording(self):
            latents = self.diffuse(
                latents=latents,
                timesteps=recorder.loop_timesteps,
                prompt_embeds=cond["prompt_embeds"],
                pooled_prompt_embeds=cond["pooled_prompt_embeds"],
                negative_prompt_embeds=cond.get("negative_prompt_embeds"),
                negative_pooled_prompt_embeds=cond.get("negative_pooled_prompt_embeds"),
                do_true_cfg=spec.uses_cfg,
                guidance_scale=spec.true_cfg_scale,
                cfg_normalize=False,
            )
        self._current_timestep = None
        latents = latents.to(self.vae.dtype) / self.vae.config.scaling_factor + self.vae.config.shift_factor
        images = self.vae.decode(latents, return_dict=False)[0]
        return self.rollout_outputs(recorder, images, cond, packed=False)

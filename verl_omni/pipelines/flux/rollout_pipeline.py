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


def prompt_conditioning(pipe, requests, spec) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """A FLUX.1 pipeline's prompt conditioning, one row per request: T5 ``prompt_embeds`` ``[R, T, D]`` and CLIP
    ``pooled_prompt_embeds`` ``[R, D]`` of the prompt ids' text; and the text position ids ``[T, 3]``."""
    if spec.uses_cfg:
        raise ValueError(f"FLUX.1 is guidance-distilled: true_cfg_scale={spec.true_cfg_scale} must be <= 1")
    texts = pipe.prompt_texts(pipe.tokenizer, requests)
    embeds, pooled, text_ids = pipe.encode_prompt(texts, None, max_sequence_length=MAX_SEQUENCE_LENGTH)
    return {"prompt_embeds": embeds, "pooled_prompt_embeds": pooled}, text_ids


def embedded_guidance(pipe, spec, batch_size: int, device: torch.device) -> torch.Tensor | None:
    """The guidance embedding's input ``[B]`` (fp32, the spec's ``guidance_scale``) of a FLUX.1 pipeline ``pipe``
    (None without a guidance embedding), its loop state set as the stock forward sets it. Made on ``device``
    (the latents'): FLUX.1-Kontext's stock ``diffuse`` passes it to the transformer's linear layers as it is."""
    pipe._guidance_scale, pipe._joint_attention_kwargs = spec.guidance_scale, {}
    if not pipe.transformer.guidance_embeds:
        return None
    return torch.full([batch_size], float(spec.guidance_scale), dtype=torch.float32, device=device)


def decode(pipe, latents: torch.Tensor, spec) -> torch.Tensor:
    """Images ``[B, 3, H, W]`` of a FLUX.1 pipeline's final packed latents (the stock un-normalisation)."""
    pipe._current_timestep = None
    images = pipe._unpack_latents(latents, spec.height, spec.width, pipe.vae_scale_factor)
    images = images / pipe.vae.config.scaling_factor + pipe.vae.config.shift_factor
    return pipe.vae.decode(images.to(pipe.vae.dtype), return_dict=False)[0]


class FluxLogProbPipeline(DiffusersRolloutMixin, FluxPipeline):
    """FLUX.1 rollout pipeline: token ids in; images, SDE trajectories and log-probs out."""

    def rollout_forward(self, req):
        requests, spec = self.start_batch(req)
        cond, text_ids = prompt_conditioning(self, requests, spec)
        cond = {k: self.per_sample(v, requests) for k, v in cond.items()}

        recorder = RolloutRecorder(requests, self.device)
        latents, image_ids = self.prepare_latents(
            recorder.num_samples,
            self.transformer.in_channels // 4,
            spec.height,
            spec.width,
            cond["prompt_embeds"].dtype,
            self.device,
            recorder.generators,
        )
        self.start_schedule(recorder, spec, latents.shape[1], latents.device)
        guidance = embedded_guidance(self, spec, latents.shape[0], latents.device)
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
        return self.rollout_outputs(recorder, decode(self, latents, spec), cond, packed=True)

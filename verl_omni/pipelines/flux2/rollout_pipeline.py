"""vLLM-Omni FLUX.2 pipelines that sample with the Flow-GRPO SDE step and record log-probs (dev here; klein reuses
:class:`Flux2RolloutMixin`).

Named by ``Flux2TrainingAdapter.rollout_pipeline``; vLLM-Omni loads it as the custom pipeline of a
``Flux2Pipeline`` checkpoint. It reuses vLLM-Omni's text encoding (the system prompt and the prompt in Mistral's
chat template, padded to 512 tokens, the hidden states of layers 10, 20 and 30 stacked), latents (FLUX.2's
patchified, packed tokens), schedule (linear σ with FLUX.2's empirical μ, the stock module's
``compute_empirical_mu``), transformer and VAE decoding (latent batch norm undone, unpatchified). The denoising
loop is written here with the recorder's four calls: vLLM-Omni 0.26's FLUX.2 pipelines hold their loop inline and
serve one prompt at a time. The velocity is the training adapter's
:func:`~verl_omni.pipelines.flux2.training_adapter.guided_velocity`, the code the replay runs.

FLUX.2-dev is guidance-distilled: the spec's ``guidance_scale`` (default 4) is embedded and no negative prompt is
encoded. The stock forward would also run true CFG when a request carries a negative prompt; the sampling spec
refuses ``true_cfg_scale`` > 1 for this model, and so does this pipeline (the adapter's ``cfg_refusal``).

The prompt ids are the bare Mistral ids (``Flux2TrainingAdapter.prompt_token_ids``); their text is what the stock
encoder templates. Recorded per sample: ``prompt_embeds`` ``[512, 3D]``; the latents are FLUX.2's own ``[S, 4C]``
tokens.
"""

from __future__ import annotations

import numpy as np
import torch
from vllm_omni.diffusion.models.flux2.pipeline_flux2 import Flux2Pipeline, compute_empirical_mu, retrieve_timesteps

from verl_omni.pipelines.diffusers_rollout import DiffusersRolloutMixin
from verl_omni.pipelines.flux2.training_adapter import (
    MAX_SEQUENCE_LENGTH,
    Flux2FamilyAdapter,
    Flux2TrainingAdapter,
    guided_velocity,
)
from verl_omni.pipelines.recorder import RolloutRecorder
from verl_omni.pipelines.rollout_request import RolloutRequest
from verl_omni.pipelines.schedulers.flow_match_sde import schedule_sigmas
from verl_omni.utils.vllm_omni_compat import mistral_encoder_rope_theta


class Flux2RolloutMixin(DiffusersRolloutMixin):
    """The FLUX.2 rollout loop, put before vLLM-Omni's FLUX.2 pipeline class (``Flux2Pipeline`` or
    ``Flux2KleinPipeline``: the same latents, schedule and decoding; ``encode_prompt`` alike)."""

    #: the model's training adapter: its guidance embedding is the one the replay passes
    adapter: type[Flux2FamilyAdapter]

    def forward(self, req):
        """The rollout; the engine's start-up warm-up takes the stock text-to-image path. vLLM-Omni gives that
        request a blank source image because the stock classes also edit (``support_image_input``), and 0.26's
        edit path fails on it (sides under 64 px are refused; at any size klein's loop appends the source tokens'
        position ids a second time, one set more than there are tokens): the image is dropped, this rollout
        takes none."""
        if req.is_dummy_run():
            for prompt in req.prompts:
                if isinstance(prompt, dict):
                    prompt.pop("multi_modal_data", None)
        return super().forward(req)

    def conditioning(self, requests: list[RolloutRequest], negative: bool) -> dict[str, torch.Tensor]:
        texts = self.prompt_texts(self.tokenizer, requests, negative=negative)
        embeds, _ = self.encode_prompt(texts, self._execution_device, max_sequence_length=MAX_SEQUENCE_LENGTH)
        return {("negative_prompt_embeds" if negative else "prompt_embeds"): self.per_sample(embeds, requests)}

    def rollout_forward(self, req):
        requests, spec, cond = self.conditioned_batch(req)
        # CFG for a checkpoint that samples without: refused as before Ray starts (the adapter's ``cfg_refusal``)
        self.adapter.for_checkpoint(self.od_config.model).refuse_cfg(spec, f"{self.od_config.model}: ")
        device = self._execution_device
        recorder = RolloutRecorder(requests, device)
        latents, latent_ids = self.prepare_latents(
            recorder.num_samples,
            self.transformer.config.in_channels // 4,
            spec.height,
            spec.width,
            torch.float32,
            device,
            recorder.generators,
        )
        steps = spec.num_inference_steps
        sigmas = None if self.scheduler.config.get("use_flow_sigmas") else np.linspace(1.0, 1 / steps, steps)
        mu = compute_empirical_mu(image_seq_len=latents.shape[1], num_steps=steps)
        timesteps, _ = retrieve_timesteps(self.scheduler, steps, device, sigmas=sigmas, mu=mu)
        self._num_timesteps, self._current_timestep, self._interrupt = len(timesteps), None, False
        recorder.set_schedule(schedule_sigmas(self.scheduler, device), timesteps)

        grid = (spec.height // (2 * self.vae_scale_factor), spec.width // (2 * self.vae_scale_factor))
        dtype = self.transformer.dtype
        negative = cond["negative_prompt_embeds"].to(dtype) if spec.uses_cfg else None
        guidance = self.adapter.embedded_guidance(spec, latents.shape[0], device)
        for t in recorder.loop_timesteps:
            timestep = t.expand(latents.shape[0]).to(dtype)
            velocity = guided_velocity(
                self.transformer,
                latents.to(dtype),
                timestep,
                grid,
                cond["prompt_embeds"].to(dtype),
                guidance,
                negative,
                spec.true_cfg_scale,
            )
            latents = recorder.step(velocity, latents)
        return self.rollout_outputs(recorder, self._decode(latents, latent_ids), cond, packed=True)

    def _decode(self, latents: torch.Tensor, latent_ids: torch.Tensor) -> torch.Tensor:
        """Images ``[B, 3, H, W]`` of the final packed tokens, as the stock forward decodes them."""
        latents = self._unpack_latents_with_ids(latents, latent_ids)
        bn = self.vae.bn
        std = torch.sqrt(bn.running_var.view(1, -1, 1, 1) + self.vae.config.batch_norm_eps)
        latents = latents * std.to(latents) + bn.running_mean.view(1, -1, 1, 1).to(latents)
        latents = self._unpatchify_latents(latents)
        return self.vae.decode(latents.to(self.vae.dtype), return_dict=False)[0]


class Flux2LogProbPipeline(Flux2RolloutMixin, Flux2Pipeline):
    """FLUX.2-dev rollout pipeline: token ids in; images, SDE trajectories and log-probs out."""

    adapter = Flux2TrainingAdapter

    def __init__(self, *, od_config, prefix: str = ""):
        super().__init__(od_config=od_config, prefix=prefix)
        # the text encoder's RoPE base from its config (vLLM-Omni 0.26 misses it under transformers 5)
        mistral_encoder_rope_theta(self.text_encoder)

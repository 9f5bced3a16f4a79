"""vLLM-Omni FLUX.2-klein pipeline that samples with the Flow-GRPO SDE step and records log-probs.

Named by ``Flux2KleinTrainingAdapter.rollout_pipeline``; vLLM-Omni loads it as the custom pipeline of a
``Flux2KleinPipeline`` checkpoint. It reuses vLLM-Omni's text encoding (the chat-templated prompt padded
to 512 tokens, the Qwen3 hidden states of the configured layers stacked), latents (FLUX.2's patchified,
packed tokens), schedule (linear σ with FLUX.2's empirical μ, the stock module's ``compute_empirical_mu``),
transformer and VAE decoding (latent batch norm undone, unpatchified). The denoising loop is written
here with the recorder's four calls: vLLM-Omni 0.26's ``Flux2KleinPipeline.forward`` holds its loop
inline and serves one prompt at a time. The guided velocity is the training adapter's
:func:`~verl_omni.pipelines.flux2_klein.training_adapter.guided_velocity`, the code the replay runs.

The stock pipeline never reads ``model_index.json``'s ``is_distilled`` (its ``is_distilled`` is a constructor
argument vLLM-Omni's loader does not pass): this one sets it from the checkpoint, and refuses CFG for the
step-distilled model as its adapter does before Ray starts.

The prompt ids are the bare Qwen3 ids (``Flux2KleinTrainingAdapter.prompt_token_ids``); their text is what the
stock encoder templates. Recorded per sample: ``prompt_embeds`` ``[512, 3D]`` and, with CFG,
``negative_prompt_embeds`` (the empty prompt unless one is sent); the latents are FLUX.2's own ``[S, 4C]`` tokens.
"""

from __future__ import annotations

import numpy as np
import torch
from vllm_omni.diffusion.models.flux2_klein.pipeline_flux2_klein import (
    Flux2KleinPipeline,
    compute_empirical_mu,
    retrieve_timesteps,
)

from verl_omni.pipelines.diffusers_rollout import DiffusersRolloutMixin
from verl_omni.pipelines.flux2_klein.training_adapter import MAX_SEQUENCE_LENGTH, guided_velocity, is_distilled
from verl_omni.pipelines.recorder import RolloutRecorder
from verl_omni.pipelines.rollout_request import RolloutRequest
from verl_omni.pipelines.schedulers.flow_match_sde import schedule_sigmas


class Flux2KleinLogProbPipeline(DiffusersRolloutMixin, Flux2KleinPipeline):
    """FLUX.2-klein rollout pipeline: token ids in; images, SDE trajectories and log-probs out."""

    supports_request_batch = True

    def __init__(self, *, od_config, prefix: str = ""):
        super().__init__(od_config=od_config, prefix=prefix, is_distilled=is_distilled(od_config.model))

    def forward(self, req):
        """The rollout; the engine's start-up warm-up takes the stock text-to-image path. vLLM-Omni gives that
        request a blank source image because the stock class also edits (``support_image_input``), and 0.26's
        edit path fails on it (sides under 64 px are refused; at any size its loop appends the source tokens'
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
        if spec.uses_cfg and self.is_distilled:
            raise ValueError(
                f"true_cfg_scale={spec.true_cfg_scale}: {self.od_config.model} is the step-distilled FLUX.2-klein, "
                "which samples without CFG; send true_cfg_scale <= 1"
            )
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
        for t in recorder.loop_timesteps:
            timestep = t.expand(latents.shape[0]).to(dtype)
            velocity = guided_velocity(
                self.transformer,
                latents.to(dtype),
                timestep,
                grid,
                cond["prompt_embeds"].to(dtype),
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

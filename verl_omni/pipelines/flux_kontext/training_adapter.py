"""FLUX.1-Kontext on the training side: FLUX.1-dev's transformer with the source image's latent tokens appended.

FLUX.1-Kontext-dev is FLUX.1-dev's architecture (guidance-distilled: the guidance scale enters as an
embedding, one pass per step, no negative prompt) trained for editing: every transformer pass reads the noise
tokens ``[S, 4C]`` followed by the source image's packed VAE latents ``[S_c, 4C]``, with position ids
(0, row, column) for the generated image and (1, row, column) for the source, and the first ``S`` output
tokens are the velocity (diffusers' and vLLM-Omni's ``FluxKontextPipeline`` alike). The replay lays the
tokens out the same way from what the rollout recorded: ``image_latents`` (right-padded to the batch) and
``image_latents_grid`` ``[1, 2]`` (the source's packed rows, columns), samples whose source images
conditioned at other sizes predicted in separate transformer calls. Schedule, text conditioning, guidance,
LoRA targets and the rollout's LoRA form are FLUX.1-dev's (:class:`FluxTrainingAdapter`).
"""

from __future__ import annotations

import torch

from verl_omni.pipelines.diffusers_adapter import source_grid_groups, with_source_tokens
from verl_omni.pipelines.flux.training_adapter import FluxTrainingAdapter, image_position_ids
from verl_omni.pipelines.model_base import register_model_adapter

# the source image tokens' first position id (the generated image's are 0)
SOURCE_POSITION_INDEX = 1


@register_model_adapter("FluxKontextPipeline")
class FluxKontextTrainingAdapter(FluxTrainingAdapter):
    """Training adapter for ``FluxKontextPipeline`` checkpoints (FLUX.1-Kontext-dev: one source image per prompt)."""

    max_source_images = 1
    # FLUX.1's prompt conditioning, then the source image's latent tokens with their (rows, columns) grid
    conditioning_keys = FluxTrainingAdapter.conditioning_keys + ("image_latents", "image_latents_grid")
    # condition_area: pixels of the source image as the VAE sees it (default: its own size, floored to 16 px)
    sampling_keys = ("condition_area",)
    rollout_pipeline = "verl_omni.pipelines.flux_kontext.rollout_pipeline.FluxKontextLogProbPipeline"
    lora_file_pipeline = "FluxKontextPipeline"

    @classmethod
    def step_velocity(cls, module, batch, step: int, spec, vae_scale_factor: int) -> torch.Tensor:
        """Packed velocity ``[B, S, 4C]`` at recorded step ``step``: noise tokens then the source image's, first S
        kept."""
        cls.refuse_true_cfg(spec)
        x = batch["all_latents"][:, step]
        height, width = cls.latent_grid(spec, vae_scale_factor)
        noise_ids = image_position_ids(height // 2, width // 2, x.device, x.dtype)
        velocity = torch.empty_like(x)
        for rows, grid in source_grid_groups(batch["image_latents_grid"]):
            source_ids = [image_position_ids(r, c, x.device, x.dtype, SOURCE_POSITION_INDEX) for r, c in grid]
            hidden = with_source_tokens(x, batch["image_latents"], rows, grid)
            prompt = {k: batch[k][rows] for k in ("all_timesteps", "prompt_embeds", "pooled_prompt_embeds")}
            ids = torch.cat([noise_ids, *source_ids])
            answer = cls.transformer_velocity(module, hidden, ids, prompt, step, spec)[:, : x.shape[1]]
            velocity[rows] = answer.to(x.dtype)  # bf16 under autocast, stored in the latents' dtype
        return velocity

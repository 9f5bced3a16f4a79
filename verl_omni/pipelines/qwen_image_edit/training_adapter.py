"""Qwen-Image-Edit on the training side: Qwen-Image's transformer with the source images' latent tokens appended.

The rollout (``rollout_pipeline``) appends the source images' packed VAE latents ``[S_c, 4C]`` (one image's
tokens after the other) to the noise tokens ``[S, 4C]`` of every transformer pass, with the RoPE shapes
``[(1, h, w), (1, rows_1, cols_1), ...]`` (output grid, then each source image's grid), and keeps the
first ``S`` output tokens as the velocity; the text stream is the Qwen2.5-VL encoding of the templated
instruction with the source images. The replay lays the tokens out the same way from what the rollout
recorded: ``image_latents`` (right-padded to the batch) and ``image_latents_grid`` ``[K, 2]`` (each
image's rows, columns; all-zero rows are padding), samples whose source images conditioned at other
sizes predicted in separate transformer calls. Schedule, true CFG (rescaled per token; slicing first
changes nothing) and the LoRA targets are Qwen-Image's.
"""

from __future__ import annotations

import torch

from verl_omni.pipelines.diffusers_adapter import source_grid_groups, with_source_tokens
from verl_omni.pipelines.model_base import register_model_adapter
from verl_omni.pipelines.qwen_image.training_adapter import QwenImageTrainingAdapter, _embeds


@register_model_adapter("QwenImageEditPipeline")
class QwenImageEditTrainingAdapter(QwenImageTrainingAdapter):
    """Training adapter for ``QwenImageEditPipeline`` checkpoints (one source image per prompt)."""

    rollout_pipeline = "verl_omni.pipelines.qwen_image_edit.rollout_pipeline.QwenImageEditLogProbPipeline"
    lora_file_pipeline = "QwenImageEditPipeline"
    # the VL prompt embeddings, and the source images' latent tokens with each image's (rows, columns) grid
    conditioning_keys = ("prompt_embeds", "prompt_embeds_mask", "image_latents", "image_latents_grid")
    # condition_area: pixels of the source image as the VAE and the vision tower see it (default 1024²)
    sampling_keys = ("condition_area",)
    # how many source images a prompt row carries (the multi-image "Plus" variant takes more)
    max_source_images = 1
    # the source images' tokens join the sequence after the noise tokens: not split yet
    supports_sequence_parallel = False
    # an editing pair's conditioning holds its source image: no offline preference encoder yet
    preference_encoder = None

    @classmethod
    def prompt_token_ids(cls, tokenizer, prompt: str) -> list[int]:
        from verl_omni.pipelines.qwen_image_edit.rollout_request import prompt_token_ids

        return prompt_token_ids(tokenizer, prompt)

    @classmethod
    def step_velocity(cls, module, batch, step: int, spec, vae_scale_factor: int) -> torch.Tensor:
        """Velocity ``[B, S, 4C]`` at recorded step ``step``: noise tokens then the source images', first S kept."""
        x = batch["all_latents"][:, step]
        cells = 2 * vae_scale_factor
        out_grid = (1, spec.height // cells, spec.width // cells)
        velocity = torch.empty_like(x)
        for rows, grid in source_grid_groups(batch["image_latents_grid"]):
            hidden = with_source_tokens(x, batch["image_latents"], rows, grid)
            prompt = _embeds(_select(batch, rows, "prompt_embeds"), "prompt_embeds")
            negative = None
            if spec.uses_cfg:
                negative = _embeds(_select(batch, rows, "negative_prompt_embeds"), "negative_prompt_embeds")
            img_shapes = [[out_grid, *((1, r, c) for r, c in grid)]] * len(rows)
            t = batch["all_timesteps"][rows, step]
            v = cls.predict_velocity(module, hidden, t, prompt, img_shapes, negative, spec.true_cfg_scale)
            velocity[rows] = v[:, : x.shape[1]]
        return velocity


def _select(batch, rows: torch.Tensor, key: str) -> dict[str, torch.Tensor]:
    """``key`` and ``key_mask`` of the samples ``rows``, the padding columns none of them uses dropped."""
    mask = batch[f"{key}_mask"][rows]
    length = int(mask.sum(dim=1).max())
    return {key: batch[key][rows, :length], f"{key}_mask": mask[:, :length]}

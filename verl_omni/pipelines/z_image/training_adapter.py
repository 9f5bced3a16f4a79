"""Z-Image on the training side: the diffusers single-stream DiT predicts the velocity of one step.

The velocity is what vLLM-Omni's ``ZImagePipeline`` (and diffusers') compute per step: the
transformer takes per-sample lists (latents ``[C, 1, h, w]``, caption features ``[L_i, D]`` of
varying length), the reversed, normalised time ``(1000 − t) / 1000``, and predicts −v; with CFG one
call over the positives then the negatives, ``pred = pos + g·(pos − neg)``, optionally renormalised
to at most ``cfg_normalization × ‖pos‖`` per sample, and CFG is skipped once ``(1000 − t)/1000``
exceeds ``cfg_truncation``. Z-Image's ``guidance_scale`` g is the classic scale minus one
(pos + g·(pos − neg) = neg + (g + 1)·(pos − neg)): the replay's ``true_cfg_scale`` w gives g = w − 1,
so w > 1 is "CFG on" for every model, and the rollout must pass ``guidance_scale = w − 1``.
The schedule is the scheduler's own spacing after ``sigma_min = 0``: its last step is σ = 0 → 0,
which no SDE window may include.

What the rollout must record per sample (besides ``all_latents`` ``[W+1, S, 4C]`` = ``pack_latents``
of its ``[C, h, w]`` latents, and ``all_timesteps`` ``[W]``): ``prompt_embeds`` ``[L, D]`` (the
text encoder's second-to-last hidden states of the templated prompt's real tokens, right-padded)
and ``prompt_embeds_mask`` ``[L]``; with CFG also ``negative_prompt_embeds`` / ``negative_prompt_embeds_mask``
(empty negative prompt by default).
"""

from __future__ import annotations

import torch

from verl_omni.pipelines.diffusers_adapter import DiffusersFlowMatchAdapter, pack_latents, unpack_latents
from verl_omni.pipelines.model_base import register_model_adapter

# ZImagePipeline's defaults of its two CFG modifiers
DEFAULT_CFG_NORMALIZATION = 0.0
DEFAULT_CFG_TRUNCATION = 1.0


def _caption_list(batch, key: str, dtype: torch.dtype) -> list[torch.Tensor]:
    """Per-sample caption features in ``dtype``: the recorded rows where the mask is set."""
    embeds, mask = batch[key].to(dtype), batch[f"{key}_mask"].bool()
    return [embeds[i][mask[i]] for i in range(embeds.shape[0])]


def _normalise(pred: torch.Tensor, pos: torch.Tensor, cfg_normalization: float) -> torch.Tensor:
    """Scale ``pred`` down to at most ``cfg_normalization × ‖pos‖`` (norms over the whole sample)."""
    max_norm = torch.linalg.vector_norm(pos) * cfg_normalization
    norm = torch.linalg.vector_norm(pred)
    return pred * torch.where(norm > max_norm, max_norm / norm.clamp(min=1e-12), pred.new_tensor(1.0))


def cfg_scales(spec, model_time: torch.Tensor) -> list[float]:
    """Per sample, Z-Image's guidance g = w − 1 at normalised time ``model_time`` (0 without CFG and past
    ``cfg_truncation``; samples of a replay batch may be at different steps)."""
    guidance = spec.true_cfg_scale - 1 if spec.uses_cfg else 0.0
    truncation = float(spec.model_kwargs.get("cfg_truncation", DEFAULT_CFG_TRUNCATION))
    return [0.0 if truncation <= 1 and float(tn) > truncation else guidance for tn in model_time]


def guided_velocity(
    module,
    latents: torch.Tensor,
    model_time: torch.Tensor,
    captions: list[torch.Tensor],
    negative_captions: list[torch.Tensor],
    scales: list[float],
    cfg_normalization: float,
) -> torch.Tensor:
    """The velocity ``[B, C, h, w]`` (fp32) as ``ZImagePipeline`` computes it, for the diffusers transformer (replay)
    and vLLM-Omni's (rollout) alike: one call over the positives then, when a sample's scale is > 0, the negatives;
    ``pos + g·(pos − neg)`` renormalised when ``cfg_normalization`` > 0; negated (the transformer predicts −v)."""
    batch_size = latents.shape[0]
    images = list(latents.unsqueeze(2).unbind(0))
    if any(s > 0 for s in scales):
        captions = list(captions) + list(negative_captions)
        images, model_time = images * 2, model_time.repeat(2)
    out = module(images, model_time, captions)[0]
    preds = []
    for i in range(batch_size):
        pos = out[i].float()
        pred = pos
        if scales[i] > 0:
            pred = pos + scales[i] * (pos - out[batch_size + i].float())
            if cfg_normalization > 0:
                pred = _normalise(pred, pos, cfg_normalization)
        preds.append(pred)
    return -torch.stack(preds).squeeze(2)


@register_model_adapter("ZImagePipeline")
class ZImageTrainingAdapter(DiffusersFlowMatchAdapter):
    """Training adapter for ``ZImagePipeline`` checkpoints (Z-Image, Z-Image-Turbo)."""

    rollout_pipeline = "verl_omni.pipelines.z_image.rollout_pipeline.ZImageLogProbPipeline"
    transformer_class = "ZImageTransformer2DModel"
    guidance_style = "cfg"
    zero_sigma_min = True
    tokenizer_subfolder = "tokenizer"
    lora_file_pipeline = "ZImagePipeline"
    conditioning_keys = ("prompt_embeds", "prompt_embeds_mask")
    cfg_conditioning_keys = ("negative_prompt_embeds", "negative_prompt_embeds_mask")
    sampling_keys = ("cfg_normalization", "cfg_truncation")
    # diffusers and vLLM-Omni both keep ``to_out`` a ModuleList; vLLM-Omni's LoRA manager routes ``to_q``... /
    # ``w1``, ``w3`` adapters to its fused ``to_qkv`` / ``w13`` itself (the transformer's ``stacked_params_mapping``)
    rollout_name_map = ()
    fsdp_wrap_blocks = ("ZImageTransformerBlock",)
    lora_target_modules = ("to_q", "to_k", "to_v", "to_out.0")

    @classmethod
    def prompt_token_ids(cls, tokenizer, prompt: str) -> list[int]:
        """Ids of ``prompt`` in the chat template the pipeline renders (user turn + assistant header), no padding."""
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True, enable_thinking=True
        )
        return list(tokenizer(text).input_ids)

    @classmethod
    def step_velocity(cls, module, batch, step: int, spec, vae_scale_factor: int) -> torch.Tensor:
        """Packed velocity ``[B, S, 4C]`` at recorded step ``step``; CFG (with its modifiers) when ``spec.uses_cfg``."""
        tokens = batch["all_latents"][:, step]
        latents = unpack_latents(tokens, *cls.latent_grid(spec, vae_scale_factor))
        model_time = (1000 - batch["all_timesteps"][:, step].float()) / 1000
        scales = cfg_scales(spec, model_time)
        captions = _caption_list(batch, "prompt_embeds", tokens.dtype)
        negatives = _caption_list(batch, "negative_prompt_embeds", tokens.dtype) if any(s > 0 for s in scales) else []
        normalization = float(spec.model_kwargs.get("cfg_normalization", DEFAULT_CFG_NORMALIZATION))
        return pack_latents(guided_velocity(module, latents, model_time, captions, negatives, scales, normalization))

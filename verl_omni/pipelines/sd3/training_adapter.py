"""Stable Diffusion 3 / 3.5 on the training side: the diffusers MMDiT predicts the velocity of one step.

The velocity is what vLLM-Omni's ``StableDiffusion3Pipeline`` (and diffusers') compute per step:
the transformer on latents ``[B, C, h, w]`` at the scheduler's timestep (0..1000, unscaled) with
the joint prompt embeddings (CLIP-L ‖ CLIP-G hidden states zero-padded to T5's width, then the T5
tokens) and the pooled CLIP projections; classic CFG v_neg + w·(v_pos − v_neg) with the empty
negative prompt, no rescale. The schedule is the scheduler's own spacing with SD3.5's static shift.

What the rollout must record per sample (besides ``all_latents`` ``[W+1, S, 4C]`` = ``pack_latents``
of its ``[C, h, w]`` latents, and ``all_timesteps`` ``[W]``): ``prompt_embeds`` ``[77 + T, D_t5]``
and ``pooled_prompt_embeds`` ``[D_clip_l + D_clip_g]``; with CFG also ``negative_prompt_embeds`` and
``negative_pooled_prompt_embeds`` of the same shapes (T = ``max_sequence_length``, 256 by default).
"""

from __future__ import annotations

import torch

from verl_omni.pipelines.diffusers_adapter import (
    JOINT_ATTENTION_LORA_TARGETS,
    DiffusersFlowMatchAdapter,
    classic_cfg,
    pack_latents,
    unpack_latents,
)
from verl_omni.pipelines.model_base import register_model_adapter


@register_model_adapter("StableDiffusion3Pipeline")
class SD3TrainingAdapter(DiffusersFlowMatchAdapter):
    """Training adapter for ``StableDiffusion3Pipeline`` checkpoints (SD3 Medium, SD3.5 Medium / Large)."""

    rollout_pipeline = "verl_omni.pipelines.sd3.rollout_pipeline.SD3LogProbPipeline"
    transformer_class = "SD3Transformer2DModel"
    guidance_style = "cfg"
    # Flow-GRPO's SD3.5 recipe (guidance_scale 4.5 in its config; diffusers' SD3 pipeline defaults to 7)
    default_true_cfg_scale = 4.5
    # the SD3 pipelines' fallback when a dynamic-shift config lacks max_shift
    default_max_shift = 1.16
    # the CLIP-L tokenizer: its ids identify the prompt; the rollout encodes the text with all three
    tokenizer_subfolder = "tokenizer"
    lora_file_pipeline = "StableDiffusion3Pipeline"
    conditioning_keys = ("prompt_embeds", "pooled_prompt_embeds")
    cfg_conditioning_keys = ("negative_prompt_embeds", "negative_pooled_prompt_embeds")
    # diffusers and vLLM-Omni both keep ``to_out`` a ModuleList and name the rest alike; vLLM-Omni fuses
    # q/k/v into ``to_qkv`` / ``add_kv_proj`` and its LoRA manager routes ``to_q``... adapters there itself
    # (the transformer's ``stacked_params_mapping``): no rollout_fused_lora_modules
    rollout_name_map = ()
    fsdp_wrap_blocks = ("JointTransformerBlock",)
    # attention projections of both streams (and of SD3.5's second image attention): Flow-GRPO's SD3.5 targets
    lora_target_modules = JOINT_ATTENTION_LORA_TARGETS

    @classmethod
    def step_velocity(cls, module, batch, step: int, spec, vae_scale_factor: int) -> torch.Tensor:
        """Packed velocity ``[B, S, 4C]`` at recorded step ``step``; classic CFG when ``spec.uses_cfg``."""
        tokens = batch["all_latents"][:, step]
        latents = unpack_latents(tokens, *cls.latent_grid(spec, vae_scale_factor))
        timestep = batch["all_timesteps"][:, step].to(tokens.dtype)

        prefixes = ("", "negative_") if spec.uses_cfg else ("",)
        # CFG's two passes as one call on [2B, ...]: SD3's prompt embeddings are fixed-length (77 CLIP + the T5
        # tokens, no mask), so the two batches stack as they are; one call on twice the rows fills the GPU's GEMMs
        # better than two and halves the per-call overheads
        velocity = module(
            hidden_states=latents.repeat(len(prefixes), *([1] * (latents.dim() - 1))),
            timestep=timestep.repeat(len(prefixes)),
            encoder_hidden_states=torch.cat([batch[f"{p}prompt_embeds"] for p in prefixes]).to(tokens.dtype),
            pooled_projections=torch.cat([batch[f"{p}pooled_prompt_embeds"] for p in prefixes]).to(tokens.dtype),
            return_dict=False,
        )[0]
        if spec.uses_cfg:
            positive, negative = velocity.chunk(2)
            velocity = classic_cfg(positive, negative, spec.true_cfg_scale)
        return pack_latents(velocity)

"""FLUX.1-dev on the training side: the diffusers MMDiT with its guidance embedding predicts one step's velocity.

FLUX.1-dev is guidance-distilled: the guidance scale enters the transformer as an embedding and
each step is one pass, with no negative prompt (true CFG is refused). The velocity is what
vLLM-Omni's ``FluxPipeline`` (and diffusers') compute per step: the transformer on packed latent
tokens ``[B, S, 4C]`` at ``timestep / 1000`` with ``guidance = [g] * B`` (fp32; the transformer scales
both by 1000), the T5 token embeddings, the pooled CLIP vector, zero text position ids and
(row, column) image position ids. The schedule passes ``sigmas = linspace(1, 1/N, N)`` with the
resolution-dependent shift μ(S).

What the rollout must record per sample (besides ``all_latents`` ``[W+1, S, 4C]``, FLUX's own packed
latents, and ``all_timesteps`` ``[W]``): ``prompt_embeds`` ``[T, D_t5]`` (T = ``max_sequence_length``,
512 by default) and ``pooled_prompt_embeds`` ``[D_clip]``. The guidance scale is a sampling setting
(``SamplingSpec.guidance_scale``, default 3.5).
"""

from __future__ import annotations

import torch

from verl_omni.pipelines.diffusers_adapter import JOINT_ATTENTION_LORA_TARGETS, DiffusersFlowMatchAdapter
from verl_omni.pipelines.model_base import register_model_adapter


def image_position_ids(grid_height: int, grid_width: int, device, dtype, index: int = 0) -> torch.Tensor:
    """``[h·w, 3]`` position ids of the packed image tokens: (index, row, column), row-major (index 0: the
    generated image; FLUX.1-Kontext's source image tokens have 1)."""
    rows = torch.arange(grid_height, device=device).repeat_interleave(grid_width)
    cols = torch.arange(grid_width, device=device).repeat(grid_height)
    return torch.stack([torch.full_like(rows, index), rows, cols], dim=1).to(dtype)


@register_model_adapter("FluxPipeline")
class FluxTrainingAdapter(DiffusersFlowMatchAdapter):
    """Training adapter for ``FluxPipeline`` checkpoints with a guidance embedding (FLUX.1-dev)."""

    rollout_pipeline = "verl_omni.pipelines.flux.rollout_pipeline.FluxLogProbPipeline"
    transformer_class = "FluxTransformer2DModel"
    guidance_style = "distilled"
    # FluxPipeline's default guidance scale (FLUX.1-dev's recommended 3.5)
    default_guidance_scale = 3.5
    linear_sigmas = True
    # the CLIP tokenizer: its ids identify the prompt; the rollout encodes the text with CLIP and T5
    tokenizer_subfolder = "tokenizer"
    lora_file_pipeline = "FluxPipeline"
    conditioning_keys = ("prompt_embeds", "pooled_prompt_embeds")
    cfg_conditioning_keys = ()
    # diffusers and vLLM-Omni both keep ``to_out`` a ModuleList and name the rest alike
    rollout_name_map = ()
    # vLLM-Omni 0.26's FLUX transformer fuses q/k/v of both streams but, unlike its SD3 / Z-Image / Qwen-Image,
    # exposes no ``stacked_params_mapping`` (only a ``packed_modules_mapping`` its diffusion LoRA manager does
    # not read): that manager would leave ``to_q``... adapters unbound, so they are exported fused
    rollout_fused_lora_modules = (
        ("to_qkv", ("to_q", "to_k", "to_v")),
        ("add_kv_proj", ("add_q_proj", "add_k_proj", "add_v_proj")),
    )
    fsdp_wrap_blocks = ("FluxTransformerBlock", "FluxSingleTransformerBlock")
    # attention projections of the double-stream blocks (the single-stream blocks share to_q/k/v)
    lora_target_modules = JOINT_ATTENTION_LORA_TARGETS

    @classmethod
    def embedded_guidance(cls, spec) -> float:
        """The embedded guidance scale of ``spec`` (``SamplingSpec.guidance_scale``; null: the model's default)."""
        return float(cls.default_guidance_scale if spec.guidance_scale is None else spec.guidance_scale)

    @classmethod
    def refuse_true_cfg(cls, spec) -> None:
        """The replay's check: the model is guidance-distilled, a true-CFG spec is refused."""
        if spec.uses_cfg:
            raise ValueError(
                f"FLUX.1 ({cls.lora_file_pipeline}) is guidance-distilled: true_cfg_scale={spec.true_cfg_scale} is "
                "not supported (set it to 1 and steer with guidance_scale)"
            )

    @classmethod
    def step_velocity(cls, module, batch, step: int, spec, vae_scale_factor: int) -> torch.Tensor:
        """Packed velocity ``[B, S, 4C]`` at recorded step ``step``: one pass with the guidance embedding."""
        cls.refuse_true_cfg(spec)
        tokens = batch["all_latents"][:, step]
        height, width = cls.latent_grid(spec, vae_scale_factor)
        ids = image_position_ids(height // 2, width // 2, tokens.device, tokens.dtype)
        return cls.transformer_velocity(module, tokens, ids, batch, step, spec)

    @classmethod
    def transformer_velocity(cls, module, hidden, img_ids, batch, step: int, spec) -> torch.Tensor:
        """The transformer's output ``[B, S', 4C]`` for the image tokens ``hidden`` ``[B, S', 4C]`` at position ids
        ``img_ids`` ``[S', 3]``, conditioned on ``batch``'s prompt of the same B samples at recorded step ``step``."""
        prompt_embeds = batch["prompt_embeds"].to(hidden.dtype)
        guidance = None
        if module.config.guidance_embeds:
            guidance = torch.full(
                (hidden.shape[0],), cls.embedded_guidance(spec), dtype=torch.float32, device=hidden.device
            )
        return module(
            hidden_states=hidden,
            timestep=batch["all_timesteps"][:, step].to(hidden.dtype) / 1000,
            guidance=guidance,
            pooled_projections=batch["pooled_prompt_embeds"].to(hidden.dtype),
            encoder_hidden_states=prompt_embeds,
            txt_ids=prompt_embeds.new_zeros(prompt_embeds.shape[1], 3),
            img_ids=img_ids,
            return_dict=False,
        )[0]

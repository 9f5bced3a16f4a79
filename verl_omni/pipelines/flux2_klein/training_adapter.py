"""FLUX.2-klein on the training side: the diffusers FLUX.2 transformer predicts one step's velocity.

The velocity is what vLLM-Omni's ``Flux2KleinPipeline`` (and diffusers') compute per step: the
transformer on FLUX.2's packed latent tokens ``[B, S, 4C]`` (the patchified latents, row-major) at
``timestep / 1000``, with no guidance embedding, the prompt's Qwen3 features ``[B, T, 3D]`` (the hidden
states of three layers of the text encoder, stacked along the features, for the chat-templated
prompt padded to T = 512 tokens, padding included), text position ids ``(0, 0, 0, l)`` and image
position ids ``(0, row, column, 0)``. The base model uses classic CFG against the empty prompt,
``neg + w·(pos − neg)`` with w the pipelines' ``guidance_scale``. The schedule passes
``sigmas = linspace(1, 1/N, N)`` with FLUX.2's empirical μ(S, N) (``compute_empirical_mu``: a fit in
both the token count and the step count, unlike FLUX.1's μ(S)).

Two kinds of checkpoint share the architecture name; ``model_index.json``'s ``is_distilled`` tells them
apart (:meth:`Flux2KleinTrainingAdapter.for_checkpoint`): the base model (CFG, 50 steps) and the
step-distilled one (4 steps, no CFG: the pipelines ignore its guidance scale), whose adapter refuses
``true_cfg_scale`` > 1 before Ray starts.

What the rollout must record per sample (besides ``all_latents`` ``[W+1, S, 4C]`` and ``all_timesteps``
``[W]``): ``prompt_embeds`` ``[T, 3D]``; with CFG also ``negative_prompt_embeds`` (the empty prompt's).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from verl_omni.pipelines.diffusers_adapter import (
    JOINT_ATTENTION_LORA_TARGETS,
    DiffusersFlowMatchAdapter,
    classic_cfg,
)
from verl_omni.pipelines.model_base import register_model_adapter

# Flux2KleinPipeline's default guidance_scale, the base model's recommended CFG scale
BASE_CFG_SCALE = 4.0
# the pipelines' max_sequence_length: the templated prompt is padded (and truncated) to this many tokens
MAX_SEQUENCE_LENGTH = 512


def is_distilled(model_path: str | Path) -> bool:
    """Whether the checkpoint is the step-distilled klein (``model_index.json``'s ``is_distilled``)."""
    index = Path(model_path) / "model_index.json"
    return bool(json.loads(index.read_text()).get("is_distilled", False)) if index.is_file() else False


def position_ids(grid_height: int, grid_width: int, text_length: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """FLUX.2's 4-axis (t, h, w, l) position ids: image tokens ``[h·w, 4]`` = (0, row, column, 0) row-major, and
    text tokens ``[T, 4]`` = (0, 0, 0, index)."""
    rows = torch.arange(grid_height, device=device).repeat_interleave(grid_width)
    cols = torch.arange(grid_width, device=device).repeat(grid_height)
    image = torch.stack([torch.zeros_like(rows), rows, cols, torch.zeros_like(rows)], dim=1)
    index = torch.arange(text_length, device=device)
    zeros = torch.zeros_like(index)
    return image, torch.stack([zeros, zeros, zeros, index], dim=1)


def guided_velocity(
    transformer,
    tokens: torch.Tensor,
    timestep: torch.Tensor,
    grid: tuple[int, int],
    prompt_embeds: torch.Tensor,
    negative_prompt_embeds: torch.Tensor | None,
    cfg_scale: float,
) -> torch.Tensor:
    """The velocity ``[B, S, 4C]`` as the klein pipelines compute it, for the diffusers transformer (replay) and
    vLLM-Omni's (rollout) alike: ``tokens`` ``[B, S, 4C]`` on a ``grid`` of (rows, columns) tokens at ``timestep``
    ``[B]`` (0..1000); one pass on the prompt and, with ``negative_prompt_embeds``, one on the negative prompt,
    ``neg + cfg_scale·(pos − neg)``."""
    # one row of ids per sample, as the pipelines pass them: the context-parallel plan splits the 3-D ids
    img_ids, txt_ids = (
        ids.expand(tokens.shape[0], *ids.shape) for ids in position_ids(*grid, prompt_embeds.shape[1], tokens.device)
    )

    def forward(embeds: torch.Tensor) -> torch.Tensor:
        return transformer(
            hidden_states=tokens,
            timestep=timestep / 1000,
            guidance=None,
            encoder_hidden_states=embeds.to(tokens.dtype),
            txt_ids=txt_ids,
            img_ids=img_ids,
            return_dict=False,
        )[0]

    velocity = forward(prompt_embeds)
    if negative_prompt_embeds is not None:
        velocity = classic_cfg(velocity, forward(negative_prompt_embeds), cfg_scale)
    return velocity


@register_model_adapter("Flux2KleinPipeline")
class Flux2KleinTrainingAdapter(DiffusersFlowMatchAdapter):
    """Training adapter for ``Flux2KleinPipeline`` checkpoints: the base model (CFG); see the distilled variant."""

    rollout_pipeline = "verl_omni.pipelines.flux2_klein.rollout_pipeline.Flux2KleinLogProbPipeline"
    transformer_class = "Flux2Transformer2DModel"
    guidance_style = "cfg"
    default_true_cfg_scale = BASE_CFG_SCALE
    # the Qwen3 tokenizer: its ids identify the prompt; the rollout applies the chat template to their text, as
    # the stock pipelines do to the prompt string
    tokenizer_subfolder = "tokenizer"
    lora_file_pipeline = "Flux2KleinPipeline"
    conditioning_keys = ("prompt_embeds",)
    cfg_conditioning_keys = ("negative_prompt_embeds",)
    # both keep ``to_out`` a ModuleList in the double-stream blocks; vLLM-Omni's LoRA manager routes ``to_q``... /
    # ``add_q_proj``... adapters to its fused ``to_qkv`` / ``add_kv_proj`` itself (``stacked_params_mapping``)
    rollout_name_map = ()
    fsdp_wrap_blocks = ("Flux2TransformerBlock", "Flux2SingleTransformerBlock")
    # diffusers' FLUX.2 transformer declares a context-parallel plan (image and text tokens and their ids split);
    # vLLM-Omni's declares a sequence-parallel one that the rollout's loop keeps (it calls the transformer as is)
    supports_sequence_parallel = True
    rollout_supports_sequence_parallel = True
    # the double-stream blocks' attention projections (the single-stream blocks fuse q/k/v with the MLP input)
    lora_target_modules = JOINT_ATTENTION_LORA_TARGETS

    @classmethod
    def for_checkpoint(cls, model_path: str | Path) -> type[Flux2KleinTrainingAdapter]:
        """The step-distilled variant for a checkpoint with ``is_distilled: true``, this one otherwise."""
        return Flux2KleinDistilledTrainingAdapter if is_distilled(model_path) else cls

    @classmethod
    def prompt_token_ids(cls, tokenizer, prompt: str) -> list[int]:
        """Ids of the bare ``prompt`` (no template, no padding), at most :data:`MAX_SEQUENCE_LENGTH`: the rollout
        decodes them and encodes the text as the pipelines encode a prompt string (Qwen's tokenizer states no
        usable maximum length of its own)."""
        return list(tokenizer(prompt, truncation=True, max_length=MAX_SEQUENCE_LENGTH).input_ids)

    @classmethod
    def set_schedule(cls, scheduler, spec, image_seq_len: int) -> None:
        """``sigmas = linspace(1, 1/N, N)`` shifted by FLUX.2's empirical μ(S, N), as the klein pipelines set it."""
        import numpy as np
        from diffusers.pipelines.flux2.pipeline_flux2_klein import compute_empirical_mu

        steps = spec.num_inference_steps
        mu = compute_empirical_mu(image_seq_len, steps)
        if scheduler.config.get("use_flow_sigmas"):
            scheduler.set_timesteps(steps, mu=mu)
        else:
            scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)

    @classmethod
    def step_velocity(cls, module, batch, step: int, spec, vae_scale_factor: int) -> torch.Tensor:
        """Packed velocity ``[B, S, 4C]`` at recorded step ``step``; classic CFG when ``spec.uses_cfg``."""
        tokens = batch["all_latents"][:, step]
        height, width = cls.latent_grid(spec, vae_scale_factor)
        negative = batch["negative_prompt_embeds"] if spec.uses_cfg else None
        timestep = batch["all_timesteps"][:, step].to(tokens.dtype)
        return guided_velocity(
            module, tokens, timestep, (height // 2, width // 2), batch["prompt_embeds"], negative, spec.true_cfg_scale
        )


class Flux2KleinDistilledTrainingAdapter(Flux2KleinTrainingAdapter):
    """The step-distilled FLUX.2-klein (``is_distilled: true``): one pass per step, no CFG. Found through
    :meth:`Flux2KleinTrainingAdapter.for_checkpoint`, not registered under a name of its own."""

    default_true_cfg_scale = 1.0
    # the pipelines ignore the guidance scale of a distilled klein: CFG is refused before Ray starts
    sampler_choices = {"true_cfg_scale": (1.0,)}

    @classmethod
    def step_velocity(cls, module, batch, step: int, spec, vae_scale_factor: int) -> torch.Tensor:
        if spec.uses_cfg:
            raise ValueError(
                f"true_cfg_scale={spec.true_cfg_scale}: the step-distilled FLUX.2-klein samples without CFG; set "
                "actor_rollout_ref.rollout.true_cfg_scale=1 (or use the base klein checkpoint for CFG)"
            )
        return super().step_velocity(module, batch, step, spec, vae_scale_factor)

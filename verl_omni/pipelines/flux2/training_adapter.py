"""FLUX.2 on the training side: the diffusers FLUX.2 transformer predicts one step's velocity (dev and klein).

The velocity is what vLLM-Omni's and diffusers' FLUX.2 pipelines (``Flux2Pipeline``, ``Flux2KleinPipeline``)
compute per step: the transformer on FLUX.2's packed latent tokens ``[B, S, 4C]`` (the patchified latents,
row-major) at ``timestep / 1000``, the prompt's text features ``[B, T, 3D]`` (the hidden states of three layers of
the text encoder, stacked along the features, for the chat-templated prompt padded to T = 512 tokens, padding
included), text position ids ``(0, 0, 0, l)`` and image position ids ``(0, row, column, 0)``. The schedule passes
``sigmas = linspace(1, 1/N, N)`` with FLUX.2's empirical μ(S, N) (``compute_empirical_mu``: a fit in both the token
count and the step count, unlike FLUX.1's μ(S)). :class:`Flux2FamilyAdapter` holds these; FLUX.2-klein's adapter
subclasses it.

FLUX.2-dev (:class:`Flux2TrainingAdapter`, ``Flux2Pipeline``): the text encoder is Mistral Small 3
(``Mistral3ForConditionalGeneration``, layers 10, 20 and 30 stacked, the pipelines' system prompt), and the model is
guidance-distilled as FLUX.1-dev: the guidance scale (``SamplingSpec.guidance_scale``, default 4, the pipelines')
enters as an embedding ``[g] * B`` (fp32; the transformer scales it by 1000), one pass per step, no negative
prompt (true CFG is refused before Ray starts).

What the rollout must record per sample (besides ``all_latents`` ``[W+1, S, 4C]`` and ``all_timesteps`` ``[W]``):
``prompt_embeds`` ``[T, 3D]``.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from verl_omni.pipelines.diffusers_adapter import (
    JOINT_ATTENTION_LORA_TARGETS,
    DiffusersFlowMatchAdapter,
    classic_cfg,
)
from verl_omni.pipelines.model_base import register_model_adapter

# the pipelines' max_sequence_length: the templated prompt is padded (and truncated) to this many tokens
MAX_SEQUENCE_LENGTH = 512
# Flux2Pipeline's default guidance_scale, FLUX.2-dev's recommended embedded guidance
DEV_GUIDANCE_SCALE = 4.0


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
    guidance: torch.Tensor | None = None,
    negative_prompt_embeds: torch.Tensor | None = None,
    cfg_scale: float = 1.0,
) -> torch.Tensor:
    """The velocity ``[B, S, 4C]`` as the FLUX.2 pipelines compute it, for the diffusers transformer (replay) and
    vLLM-Omni's (rollout) alike: ``tokens`` ``[B, S, 4C]`` on a ``grid`` of (rows, columns) tokens at ``timestep``
    ``[B]`` (0..1000), with the embedded ``guidance`` ``[B]`` of a guidance-distilled model (dev; None: klein); one
    pass on the prompt and, with ``negative_prompt_embeds``, one on the negative prompt,
    ``neg + cfg_scale·(pos − neg)`` (klein's CFG)."""
    # one row of ids per sample, as the pipelines pass them: the context-parallel plan splits the 3-D ids
    img_ids, txt_ids = (
        ids.expand(tokens.shape[0], *ids.shape) for ids in position_ids(*grid, prompt_embeds.shape[1], tokens.device)
    )

    def forward(embeds: torch.Tensor) -> torch.Tensor:
        return transformer(
            hidden_states=tokens,
            timestep=timestep / 1000,
            guidance=guidance,
            encoder_hidden_states=embeds.to(tokens.dtype),
            txt_ids=txt_ids,
            img_ids=img_ids,
            return_dict=False,
        )[0]

    velocity = forward(prompt_embeds)
    if negative_prompt_embeds is not None:
        velocity = classic_cfg(velocity, forward(negative_prompt_embeds), cfg_scale)
    return velocity


class Flux2FamilyAdapter(DiffusersFlowMatchAdapter):
    """What FLUX.2-dev and FLUX.2-klein share: the transformer, its blocks and LoRA targets, the schedule, the
    prompt ids, the recorded conditioning and the velocity. Registered under no name: each model's subclass is."""

    transformer_class = "Flux2Transformer2DModel"
    # the text encoder's tokenizer: its ids identify the prompt; the rollout applies the chat template to their
    # text, as the stock pipelines do to the prompt string
    tokenizer_subfolder = "tokenizer"
    conditioning_keys = ("prompt_embeds",)
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
    # why a checkpoint samples without CFG: true_cfg_scale > 1 is refused (before Ray starts by the sampling spec, in
    # the rollout and the replay by this message); None: CFG is served
    cfg_refusal: ClassVar[str | None] = None

    @classmethod
    def prompt_token_ids(cls, tokenizer, prompt: str) -> list[int]:
        """Ids of the bare ``prompt`` (no template, no padding), at most :data:`MAX_SEQUENCE_LENGTH`: the rollout
        decodes them and encodes the text as the pipelines encode a prompt string (the released tokenizers state no
        usable maximum length of their own). A processor (FLUX.2-dev's ``PixtralProcessor``) tokenizes with its
        tokenizer."""
        tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
        return list(tokenizer(prompt, truncation=True, max_length=MAX_SEQUENCE_LENGTH).input_ids)

    @classmethod
    def set_schedule(cls, scheduler, spec, image_seq_len: int) -> None:
        """``sigmas = linspace(1, 1/N, N)`` shifted by FLUX.2's empirical μ(S, N), as the FLUX.2 pipelines set it."""
        import numpy as np
        from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu

        steps = spec.num_inference_steps
        mu = compute_empirical_mu(image_seq_len, steps)
        if scheduler.config.get("use_flow_sigmas"):
            scheduler.set_timesteps(steps, mu=mu)
        else:
            scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)

    @classmethod
    def embedded_guidance(cls, spec, batch_size: int, device) -> torch.Tensor | None:
        """The guidance embedding's input ``[B]`` (fp32, the spec's ``guidance_scale`` or the model's default), as
        the pipelines pass it; None for a model without one (not ``guidance_style`` "distilled": klein)."""
        if cls.guidance_style != "distilled":
            return None
        scale = cls.default_guidance_scale if spec.guidance_scale is None else spec.guidance_scale
        return torch.full((batch_size,), float(scale), dtype=torch.float32, device=device)

    @classmethod
    def refuse_cfg(cls, spec, where: str = "") -> None:
        """Refuse a CFG ``spec`` for a checkpoint that samples without (:attr:`cfg_refusal`); ``where``: the
        checkpoint, named in the message."""
        if spec.uses_cfg and cls.cfg_refusal:
            raise ValueError(f"true_cfg_scale={spec.true_cfg_scale}: {where}{cls.cfg_refusal}")

    @classmethod
    def step_velocity(cls, module, batch, step: int, spec, vae_scale_factor: int) -> torch.Tensor:
        """Packed velocity ``[B, S, 4C]`` at recorded step ``step``; classic CFG when ``spec.uses_cfg``."""
        cls.refuse_cfg(spec)
        tokens = batch["all_latents"][:, step]
        height, width = cls.latent_grid(spec, vae_scale_factor)
        negative = batch["negative_prompt_embeds"] if spec.uses_cfg else None
        timestep = batch["all_timesteps"][:, step].to(tokens.dtype)
        guidance = cls.embedded_guidance(spec, tokens.shape[0], tokens.device)
        return guided_velocity(
            module,
            tokens,
            timestep,
            (height // 2, width // 2),
            batch["prompt_embeds"],
            guidance,
            negative,
            spec.true_cfg_scale,
        )


@register_model_adapter("Flux2Pipeline")
class Flux2TrainingAdapter(Flux2FamilyAdapter):
    """Training adapter for ``Flux2Pipeline`` checkpoints (FLUX.2-dev): guidance-distilled, one pass per step."""

    rollout_pipeline = "verl_omni.pipelines.flux2.rollout_pipeline.Flux2LogProbPipeline"
    guidance_style = "distilled"
    default_guidance_scale = DEV_GUIDANCE_SCALE
    lora_file_pipeline = "Flux2Pipeline"
    cfg_conditioning_keys = ()
    # vLLM-Omni 0.26's FLUX.2-dev transformer (not klein's) runs its single-stream blocks' joint attention its own
    # way when split: a split replica's samples drift from the unsplit one's beyond the fp32 reordering
    # tolerance, so the rollout split is not offered (the replay's, diffusers' context-parallel plan, is)
    rollout_supports_sequence_parallel = False
    cfg_refusal = (
        "FLUX.2-dev is guidance-distilled (one pass per step, no negative prompt); set "
        "actor_rollout_ref.rollout.true_cfg_scale=1 and steer with guidance_scale"
    )

"""Qwen-Image on the training side: load the diffusers transformer and predict the velocity of one step.

The trainer replays recorded transitions: for latents x_k at timestep t_k with the recorded prompt
embeddings, it needs the velocity the policy predicts (with true CFG when the rollout used it),
then the shared SDE step gives log π_θ. True CFG follows what the rollout engine does (vLLM-Omni
and diffusers alike): v = v_neg + w·(v_pos − v_neg), rescaled per latent token to the norm of v_pos.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from verl_omni.pipelines.diffusers_adapter import JOINT_ATTENTION_LORA_TARGETS
from verl_omni.pipelines.model_base import ODE_SAMPLES, SDE_WINDOW, ModelAdapter, register_model_adapter


@dataclass
class PromptEmbeds:
    """Text conditioning of a batch, as the rollout records it.

    Args:
        embeds (`torch.Tensor`, ``[B, L, D]``): text-encoder hidden states after the template prefix.
        mask (`torch.Tensor`, ``[B, L]``): 1 for real tokens, 0 for padding.
    """

    embeds: torch.Tensor
    mask: torch.Tensor


def _embeds(batch, key: str) -> PromptEmbeds:
    """Embeddings and mask; an all-ones mask becomes None, as diffusers' pipeline passes it (same attention path)."""
    mask = batch[f"{key}_mask"]
    return PromptEmbeds(batch[key], None if bool(mask.all()) else mask)


@register_model_adapter("QwenImagePipeline")
class QwenImageTrainingAdapter(ModelAdapter):
    """Training adapter for ``QwenImagePipeline`` checkpoints (facts as class attributes, cf. diffusers)."""

    rollout_pipeline = "verl_omni.pipelines.qwen_image.rollout_pipeline.QwenImageLogProbPipeline"
    # the shared recorder: an SDE window, or (noise level 0) the clean latents of an ODE sample
    rollout_records = (SDE_WINDOW, ODE_SAMPLES)
    transformer_subfolder = "transformer"
    tokenizer_subfolder = "tokenizer"
    # 8x VAE, latents packed 2x2: image sides divide by 16
    latent_multiple = 16
    # true CFG with a negative prompt, the combined velocity rescaled to the conditional one's norm
    guidance_style = "true_cfg"
    default_true_cfg_scale = 4.0
    # diffusers pipeline whose save_lora_weights / load_lora_weights define the LoRA file format
    lora_file_pipeline = "QwenImagePipeline"
    # the rollout records the prompt embeddings (and the negative ones under true CFG)
    conditioning_keys = ("prompt_embeds", "prompt_embeds_mask")
    cfg_conditioning_keys = ("negative_prompt_embeds", "negative_prompt_embeds_mask")
    # diffusers wraps the attention output in a ModuleList ``to_out = [Linear, Dropout]``; vLLM-Omni has one layer
    rollout_name_map = ((".to_out.0.", ".to_out."),)
    # transformer blocks wrapped one FSDP unit each
    fsdp_wrap_blocks = ("QwenImageTransformerBlock",)
    # attention projections of both streams: the usual Flow-GRPO LoRA targets for Qwen-Image
    lora_target_modules = JOINT_ATTENTION_LORA_TARGETS
    # the replay may split each sample's text and image tokens over a sequence-parallel group
    supports_sequence_parallel = True
    # vLLM-Omni's Qwen-Image transformer declares a split (_sp_plan), but a split replica samples other latents than
    # an unsplit one (beyond 1e-5, with or without CFG), which the actor's replay would not reproduce: refused
    rollout_supports_sequence_parallel = False
    # offline preference pairs (data.preference_files) encoded by the checkpoint's VAE and text encoder
    preference_encoder = "verl_omni.pipelines.qwen_image.preference_encoder.QwenImagePreferenceEncoder"

    @classmethod
    def enable_sequence_parallel(cls, module: torch.nn.Module, mesh) -> None:
        """diffusers' Ulysses split, plus the text padding and joint-mask order it needs here
        (:mod:`verl_omni.pipelines.qwen_image.sequence_parallel`)."""
        from verl_omni.pipelines.qwen_image.sequence_parallel import split_joint_attention

        super().enable_sequence_parallel(module, mesh)
        split_joint_attention(module, mesh["ulysses"].size())

    @classmethod
    def load_transformer(cls, model_path: str | Path, dtype: torch.dtype = torch.float32):
        """The diffusers ``QwenImageTransformer2DModel`` from a local checkpoint directory."""
        from diffusers import QwenImageTransformer2DModel

        path = Path(model_path) / cls.transformer_subfolder
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"model.path={model_path!s} has no {cls.transformer_subfolder}/config.json: "
                "point it at a diffusers Qwen-Image directory (see `python -m verl_omni.utils.tiny_models`)"
            )
        return QwenImageTransformer2DModel.from_pretrained(path, torch_dtype=dtype)

    @classmethod
    def prompt_token_ids(cls, tokenizer, prompt: str) -> list[int]:
        from verl_omni.pipelines.qwen_image.rollout_request import prompt_token_ids

        return prompt_token_ids(tokenizer, prompt)

    @classmethod
    def build_module(cls, model_path: str | Path, dtype: torch.dtype = torch.float32):
        return cls.load_transformer(model_path, dtype)

    @classmethod
    def build_scheduler(cls, model_path: str | Path):
        from verl_omni.pipelines.schedulers import FlowMatchSDEDiscreteScheduler

        return FlowMatchSDEDiscreteScheduler.from_pretrained(model_path, subfolder="scheduler")

    @classmethod
    def set_schedule(cls, scheduler, spec, image_seq_len: int) -> None:
        cls.set_timesteps(scheduler, spec.num_inference_steps, image_seq_len)

    @classmethod
    def step_velocity(cls, module, batch, step: int, spec, vae_scale_factor: int) -> torch.Tensor:
        """Velocity at recorded step ``step``: packed latents, recorded prompt embeddings, true CFG when on."""
        x = batch["all_latents"][:, step]
        cells = 2 * vae_scale_factor
        img_shapes = cls.img_shapes(x.shape[0], 2 * (spec.height // cells), 2 * (spec.width // cells))
        prompt = _embeds(batch, "prompt_embeds")
        negative = _embeds(batch, "negative_prompt_embeds") if spec.uses_cfg else None
        t = batch["all_timesteps"][:, step]
        return cls.predict_velocity(module, x, t, prompt, img_shapes, negative, spec.true_cfg_scale)

    @staticmethod
    def vae_scale_factor(model_path: str | Path) -> int:
        """Pixels per latent cell, as ``QwenImagePipeline`` derives it from the VAE config."""
        config = json.loads((Path(model_path) / "vae" / "config.json").read_text())
        return 2 ** len(config["temperal_downsample"])

    @staticmethod
    def set_timesteps(scheduler, num_inference_steps: int, image_seq_len: int) -> None:
        """The rollout's schedule: ``QwenImagePipeline``'s linear sigmas with the resolution-dependent shift.

        The trainer rebuilds the schedule from these two numbers to replay recorded steps, so it
        must stay identical to what the rollout pipeline does.
        """
        c = scheduler.config
        base_len, max_len = c.get("base_image_seq_len", 256), c.get("max_image_seq_len", 4096)
        base_shift, max_shift = c.get("base_shift", 0.5), c.get("max_shift", 1.15)
        slope = (max_shift - base_shift) / (max_len - base_len)
        mu = image_seq_len * slope + (base_shift - slope * base_len)
        sigmas = np.linspace(1.0, 1 / num_inference_steps, num_inference_steps)
        scheduler.set_timesteps(sigmas=sigmas, mu=mu)

    @staticmethod
    def img_shapes(batch_size: int, latent_height: int, latent_width: int) -> list[list[tuple[int, int, int]]]:
        """Per-sample (frames, h, w) of the packed 2×2 latent grid, as the transformer's RoPE expects."""
        return [[(1, latent_height // 2, latent_width // 2)]] * batch_size

    @staticmethod
    def predict_velocity(
        transformer,
        latents: torch.Tensor,
        timesteps: torch.Tensor,
        prompt: PromptEmbeds,
        img_shapes: list,
        negative: PromptEmbeds | None = None,
        true_cfg_scale: float = 1.0,
        batch_cfg: bool = True,
    ) -> torch.Tensor:
        """Velocity at packed ``latents`` ``[B, N, C]`` and scheduler ``timesteps`` ``[B]`` (0..1000).

        With ``negative`` and ``true_cfg_scale > 1`` this is true CFG. ``batch_cfg`` runs its two passes as one
        transformer call on ``[2B, ...]`` (the texts padded to the longer one, padding masked out of attention):
        the same velocity, in half the calls on twice the rows, which the replay's GEMMs and per-call overheads
        favour; ``False`` runs them one after the other (``benchmarks/actor_throughput.py`` compares both).
        """

        def forward(x: torch.Tensor, t: torch.Tensor, cond: PromptEmbeds, shapes: list) -> torch.Tensor:
            return transformer(
                hidden_states=x,
                timestep=t.to(x.dtype) / 1000,
                encoder_hidden_states=cond.embeds.to(x.dtype),
                encoder_hidden_states_mask=cond.mask,
                img_shapes=shapes,
                return_dict=False,
            )[0]

        if negative is None or true_cfg_scale <= 1.0:
            return forward(latents, timesteps, prompt, img_shapes)
        if batch_cfg:
            both = forward(
                torch.cat([latents, latents]),
                torch.cat([timesteps, timesteps]),
                _stacked(prompt, negative),
                img_shapes * 2,
            )
            v_pos, v_neg = both.chunk(2)
        else:
            v_pos = forward(latents, timesteps, prompt, img_shapes)
            v_neg = forward(latents, timesteps, negative, img_shapes)
        combined = v_neg + true_cfg_scale * (v_pos - v_neg)
        return combined * (v_pos.norm(dim=-1, keepdim=True) / combined.norm(dim=-1, keepdim=True))


def _stacked(first: PromptEmbeds, second: PromptEmbeds) -> PromptEmbeds:
    """``first`` then ``second`` as one batch ``[2B, L, D]``, the shorter padded with zeros that its mask excludes.

    The mask stays None (diffusers' unmasked attention path) exactly when neither part has one and no padding is
    added: :func:`_embeds` already made an all-ones mask None, so this needs no look at the values (no host sync
    in the replay).
    """
    length = max(first.embeds.shape[1], second.embeds.shape[1])
    if first.mask is None and second.mask is None and first.embeds.shape[1] == second.embeds.shape[1]:
        return PromptEmbeds(torch.cat([first.embeds, second.embeds]), None)
    embeds, masks = [], []
    for part in (first, second):
        batch, own = part.embeds.shape[:2]
        mask = part.mask if part.mask is not None else part.embeds.new_ones(batch, own, dtype=torch.long)
        embeds.append(torch.nn.functional.pad(part.embeds, (0, 0, 0, length - own)))
        masks.append(torch.nn.functional.pad(mask.to(torch.long), (0, length - own)))
    return PromptEmbeds(torch.cat(embeds), torch.cat(masks))

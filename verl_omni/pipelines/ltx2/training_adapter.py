"""LTX-2 on the training side: diffusers' audio-video DiT predicts the velocity of both streams at one step.

LTX-2 denoises a video latent and an audio latent together: one transformer call takes the packed
video tokens ``[B, S_v, C]`` (``S_v = F'·h·w``, one token per latent cell: F' = (F − 1)/8 + 1,
h = H/32, w = W/32) and the packed audio tokens ``[B, S_a, C]`` (one per latent audio frame, its
channels × latent mel bins), each stream attending to its own text context and to the other stream,
and returns a velocity per stream. Both streams step on one σ schedule, so one SDE step is one
step of their concatenation: the rollout records the **joint latent** ``[S_v + S_a, C]`` per sample
(video tokens first; the release's 128 video channels equal its 8 × 16 audio ones), and the
log-prob of a step is over both streams. ``S_v`` follows from the sampling spec; the rest is audio.

The velocity is what vLLM-Omni's ``LTX2Pipeline`` computes per step with CFG only (its STG, modality
guidance and rescale off): each stream's guidance in x0 space, x0 = x − σv, guided
x0_c + (w − 1)(x0_c − x0_u), back to v = (x − x0)/σ, with the video's scale ``true_cfg_scale`` and the
audio's ``audio_cfg_scale`` (``model_kwargs``; default the release's 7). The contexts are the text
connectors' outputs for the 1024 left-padded Gemma 3 tokens (padding replaced by learned registers,
so every context token is valid and no mask is passed). The schedule is the release's: σ_i =
linspace(1, 0, T + 1) under the exponential shift at ``max_shift`` with the terminal stretch of the
checkpoint's scheduler config, which diffusers' ``FlowMatchEulerDiscreteScheduler`` applies as
``LTX2Pipeline`` calls it (``mu = max_shift``).

Recorded per sample: ``all_latents`` ``[W+1, S_v + S_a, C]``, ``all_timesteps`` ``[W]`` (1000σ),
``prompt_embeds`` ``[1024, D]`` and ``audio_prompt_embeds`` ``[1024, D]`` (the connectors' video and audio
contexts) and, with CFG, the negatives of the same shapes (the empty prompt unless one is sent).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from verl_omni.pipelines.diffusers_adapter import DiffusersFlowMatchAdapter
from verl_omni.pipelines.model_base import register_model_adapter

# Gemma 3 tokens every prompt is left-padded to (the pipelines' ``max_sequence_length``)
TEXT_LENGTH = 1024
# the release's audio CFG scale (vLLM-Omni's one-stage LTX-2 recipe; the video's is 3)
DEFAULT_AUDIO_CFG_SCALE = 7.0
# the scheduler's timestep range: the transformer takes 1000σ
NUM_TRAIN_TIMESTEPS = 1000


def guided_velocity(
    latents: torch.Tensor, cond: torch.Tensor, uncond: torch.Tensor, sigma: torch.Tensor, scale: float
) -> torch.Tensor:
    """One stream's CFG in x0 space, in the order and precision of vLLM-Omni's LTX guidance (fp32 arithmetic,
    ``latents``' dtype between the steps); ``sigma`` ``[B]``."""
    s = sigma.to(torch.float32).reshape(-1, *([1] * (latents.ndim - 1)))
    x = latents.to(torch.float32)
    x0_c = (x - cond.to(torch.float32) * s).to(latents.dtype).float()
    x0_u = (x - uncond.to(torch.float32) * s).to(latents.dtype).float()
    guided = (x0_c + (scale - 1) * (x0_c - x0_u)).to(latents.dtype)
    return ((x - guided.to(torch.float32)) / s).to(latents.dtype)


@register_model_adapter("LTX2Pipeline")
class LTX2TrainingAdapter(DiffusersFlowMatchAdapter):
    """Training adapter for ``LTX2Pipeline`` checkpoints (LTX-2 text-to-audio+video, one stage)."""

    rollout_pipeline = "verl_omni.pipelines.ltx2.rollout_pipeline.LTX2LogProbPipeline"
    transformer_class = "LTX2VideoTransformer3DModel"
    guidance_style = "cfg"
    # the release's video CFG scale (vLLM-Omni's and the LTX-2 one-stage recipe's)
    default_true_cfg_scale = 3.0
    sampling_keys = ("audio_cfg_scale",)
    # 32 pixels per latent cell (4x4 patchify x 8x down-sampling, 1x1 transformer patches); 8 frames per latent frame
    latent_multiple = 32
    frame_multiple = 8
    # the release's frame rate (the pipelines' default): the validation mp4s and the video RoPE positions
    video_fps = 24
    # one sample's latent per step: the joint token sequence [S_v + S_a, C]
    latent_ndim = 2
    tokenizer_subfolder = "tokenizer"
    lora_file_pipeline = "LTX2Pipeline"
    conditioning_keys = ("prompt_embeds", "audio_prompt_embeds")
    cfg_conditioning_keys = ("negative_prompt_embeds", "negative_audio_prompt_embeds")
    # vLLM-Omni keeps diffusers' names; it fuses the video self-attention's q/k/v into attn1.to_qkv (its loader's
    # local stacked mapping, which its LoRA manager does not see), the audio one's it keeps apart
    rollout_name_map = ()
    rollout_fused_lora_modules = (("attn1.to_qkv", ("attn1.to_q", "attn1.to_k", "attn1.to_v")),)
    fsdp_wrap_blocks = ("LTX2VideoTransformerBlock",)
    # the projections of every attention of a block: video and audio self- and text cross-attention, and the
    # audio-to-video and video-to-audio cross-attentions
    lora_target_modules = ("to_q", "to_k", "to_v", "to_out.0")

    @classmethod
    def prompt_token_ids(cls, tokenizer, prompt: str) -> list[int]:
        """Gemma ids of the stripped prompt as the pipelines tokenize it (``<bos>`` added), no padding."""
        ids = tokenizer(prompt.strip(), truncation=True, max_length=TEXT_LENGTH, add_special_tokens=True).input_ids
        return list(ids)

    @classmethod
    def set_schedule(cls, scheduler, spec, image_seq_len: int) -> None:
        """The release's schedule: ``LTX2Pipeline``'s linear σ under the shift pinned at ``max_shift`` (its
        ``calculate_shift`` at the maximal sequence length), the scheduler's terminal stretch, then 0."""
        import numpy as np

        steps = spec.num_inference_steps
        scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=cls.schedule_mu(scheduler.config))

    @staticmethod
    def schedule_mu(config) -> float:
        """μ of the exponential shift: ``max_shift`` (the linear rule evaluated at ``max_image_seq_len``)."""
        return float(config.get("max_shift", 2.05))

    @staticmethod
    def vae_scale_factor(model_path: str | Path) -> int:
        """Pixels per latent cell of the LTX-2 video VAE (its ``spatial_compression_ratio``)."""
        config = json.loads((Path(model_path) / "vae" / "config.json").read_text())
        ratio = config.get("spatial_compression_ratio")
        if ratio is None:
            ratio = config["patch_size"] * 2 ** sum(config["spatio_temporal_scaling"])
        return int(ratio)

    @classmethod
    def video_grid(cls, spec, vae_scale_factor: int) -> tuple[int, int, int]:
        """(F', h, w) of the video latent of ``spec``'s frames and size."""
        return (
            (spec.num_frames - 1) // cls.frame_multiple + 1,
            spec.height // vae_scale_factor,
            spec.width // vae_scale_factor,
        )

    @classmethod
    def split_streams(
        cls, latents: torch.Tensor, spec, vae_scale_factor: int
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int, int]]:
        """Joint tokens ``[B, S_v + S_a, C]`` → video ``[B, S_v, C]``, audio ``[B, S_a, C]`` and the video grid."""
        grid = cls.video_grid(spec, vae_scale_factor)
        video_tokens = grid[0] * grid[1] * grid[2]
        if latents.shape[1] <= video_tokens:
            raise ValueError(
                f"joint latents of {latents.shape[1]} tokens hold no audio after the {video_tokens} video tokens of "
                f"{spec.num_frames} frames at {spec.height}x{spec.width}: the rollout's size and frames must be the "
                "replay's"
            )
        return latents[:, :video_tokens], latents[:, video_tokens:], grid

    @classmethod
    def step_velocity(cls, module, batch, step: int, spec, vae_scale_factor: int) -> torch.Tensor:
        """Joint velocity ``[B, S_v + S_a, C]`` at recorded step ``step``; per-stream x0 CFG when ``spec.uses_cfg``."""
        latents = batch["all_latents"][:, step]
        timestep = batch["all_timesteps"][:, step].to(latents.dtype)
        video, audio, (frames, height, width) = cls.split_streams(latents, spec, vae_scale_factor)

        def forward(prefix: str) -> tuple[torch.Tensor, torch.Tensor]:
            return module(
                hidden_states=video,
                audio_hidden_states=audio,
                encoder_hidden_states=batch[f"{prefix}prompt_embeds"].to(latents.dtype),
                audio_encoder_hidden_states=batch[f"{prefix}audio_prompt_embeds"].to(latents.dtype),
                timestep=timestep,
                sigma=timestep,
                num_frames=frames,
                height=height,
                width=width,
                fps=float(cls.video_fps),
                audio_num_frames=audio.shape[1],
                return_dict=False,
            )

        v_video, v_audio = forward("")
        # without CFG the guidance still goes through x0 and back (the pipelines' rounding), with the
        # positive prediction as its own negative
        n_video, n_audio = forward("negative_") if spec.uses_cfg else (v_video, v_audio)
        video_scale = spec.true_cfg_scale if spec.uses_cfg else 1.0
        audio_scale = float(spec.model_kwargs.get("audio_cfg_scale", DEFAULT_AUDIO_CFG_SCALE)) if spec.uses_cfg else 1.0
        sigma = timestep.float() / NUM_TRAIN_TIMESTEPS
        v_video = guided_velocity(video, v_video, n_video, sigma, video_scale)
        v_audio = guided_velocity(audio, v_audio, n_audio, sigma, audio_scale)
        return torch.cat([v_video, v_audio], dim=1)

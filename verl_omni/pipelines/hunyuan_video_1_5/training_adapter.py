"""HunyuanVideo-1.5 on the training side: diffusers' 3-D DiT predicts the velocity of one step.

The velocity is what vLLM-Omni's ``HunyuanVideo15Pipeline.forward`` (and diffusers' pipeline) computes per step: the
transformer on ``cat([latents, condition])`` ``[B, 2C + 1, F', h, w]`` at the scheduler's timestep 1000σ, with
three token streams: the Qwen2.5-VL prompt states (the chat template's system prompt and the first 108 template
tokens cropped, padded to 1000 tokens, masked), the ByT5 states of the prompt's quoted glyph text (masked; all
masked when the prompt quotes nothing) and the SigLIP image states. Text to video: the condition is zeros (no
latents, mask 0) and the image states are zeros, which the transformer masks out entirely. Image to video: the
condition is the source image's VAE latents on the first latent frame (zeros after) followed by a mask that is 1 on
that frame, and the image states are SigLIP's of the source image. Classic CFG v_neg + w·(v_pos − v_neg) on the
prompt streams only (the negative pass keeps the condition and the image states). The schedule: the flow-match
Euler scheduler with the checkpoint's static shift on σ = 1 − i/T (T steps), then 0.

Recorded per sample (unpacked, like Wan2.2's): ``all_latents`` ``[W+1, C, F', h, w]``, ``all_timesteps`` ``[W]``,
``prompt_embeds`` ``[L, D]`` + ``prompt_embeds_mask`` ``[L]``, ``prompt_embeds_2`` ``[L2, D2]`` +
``prompt_embeds_2_mask`` ``[L2]`` (trimmed to the longest real row: L2 may be 0), with CFG the ``negative_`` ones (the
empty prompt unless one is sent); image to video also ``image_condition`` ``[C + 1, F', h, w]`` and ``image_embeds``
``[T, D_img]``. Padding is masked everywhere, so the replay's padded lengths need not be the rollout's.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from verl_omni.pipelines.diffusers_adapter import JOINT_ATTENTION_LORA_TARGETS, DiffusersFlowMatchAdapter, classic_cfg
from verl_omni.pipelines.model_base import register_model_adapter

# Qwen2.5-VL tokens of a prompt the pipelines encode (``tokenizer_max_length``)
TEXT_LENGTH = 1000
# the text-to-video image stream: masked zeros, so one token of them stands for the pipelines' 729
T2V_IMAGE_TOKENS = 1


def _streams(batch, prefix: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The transformer's two prompt streams and their masks from the recorded ``prefix`` keys (masks as the pipelines
    pass them: in the model's dtype)."""
    return {
        "encoder_hidden_states": batch[f"{prefix}prompt_embeds"].to(dtype),
        "encoder_attention_mask": batch[f"{prefix}prompt_embeds_mask"].to(dtype),
        "encoder_hidden_states_2": batch[f"{prefix}prompt_embeds_2"].to(dtype),
        "encoder_attention_mask_2": batch[f"{prefix}prompt_embeds_2_mask"].to(dtype),
    }


@register_model_adapter("HunyuanVideo15Pipeline")
class HunyuanVideo15TrainingAdapter(DiffusersFlowMatchAdapter):
    """Training adapter for ``HunyuanVideo15Pipeline`` checkpoints (HunyuanVideo-1.5 text to video, 480p / 720p)."""

    rollout_pipeline = "verl_omni.pipelines.hunyuan_video_1_5.rollout_pipeline.HunyuanVideo15LogProbPipeline"
    transformer_class = "HunyuanVideo15Transformer3DModel"
    guidance_style = "cfg"
    # the released guider config's guidance_scale (vLLM-Omni's default too)
    default_true_cfg_scale = 6.0
    # the VAE's 16 pixels per latent cell x 1x1 transformer patches; 4 frames per latent frame
    latent_multiple = 16
    frame_multiple = 4
    # the release's output rate (121 frames: 5 s at 24 fps)
    video_fps = 24
    # one sample's latent per step: [C, F', h, w]
    latent_ndim = 4
    # the Qwen2.5-VL tokenizer: the prompt's ids, decoded by the rollout to the text both encoders read
    tokenizer_subfolder = "tokenizer"
    lora_file_pipeline = "HunyuanVideo15Pipeline"
    conditioning_keys = ("prompt_embeds", "prompt_embeds_mask", "prompt_embeds_2", "prompt_embeds_2_mask")
    cfg_conditioning_keys = tuple(f"negative_{k}" for k in conditioning_keys)
    # vLLM-Omni keeps diffusers' ``to_out.0`` (a ModuleList) and names the rest alike
    rollout_name_map = ()
    # vLLM-Omni fuses q/k/v of both streams but keeps its ``stacked_params_mapping`` local to ``load_weights``
    # (only a ``packed_modules_mapping`` its diffusion LoRA manager does not read): the adapters are exported fused
    rollout_fused_lora_modules = (
        ("to_qkv", ("to_q", "to_k", "to_v")),
        ("add_kv_proj", ("add_q_proj", "add_k_proj", "add_v_proj")),
    )
    fsdp_wrap_blocks = ("HunyuanVideo15TransformerBlock",)
    # both streams' attention projections of the dual-stream blocks
    lora_target_modules = JOINT_ATTENTION_LORA_TARGETS
    # the prompt token refiner's attention has the same names, but vLLM-Omni builds it from plain diffusers layers
    # its LoRA manager cannot bind
    lora_exclude_modules = r"context_embedder\..*"
    # diffusers' transformer declares no context-parallel plan (_cp_plan): the replay does not split its sequence

    @classmethod
    def for_checkpoint(cls, model_path: str | Path) -> type[HunyuanVideo15TrainingAdapter]:
        """This adapter, unless the transformer is a step-distilled MeanFlow one (it reads a second timestep, which
        neither the rollout nor the replay passes)."""
        config = json.loads((Path(model_path) / "transformer" / "config.json").read_text())
        if config.get("use_meanflow"):
            raise ValueError(
                f"model.path={model_path!s}: transformer/config.json has use_meanflow=true (a step-distilled "
                f"HunyuanVideo-1.5); {cls.__name__} trains the released 50-step checkpoints (use_meanflow false)"
            )
        return cls

    @classmethod
    def prompt_token_ids(cls, tokenizer, prompt: str) -> list[int]:
        """The prompt's own Qwen2.5-VL ids (no template, no padding, truncated to :data:`TEXT_LENGTH`): the rollout
        decodes them and applies the pipelines' chat template, and the glyph encoder reads the same text."""
        return list(tokenizer(prompt, truncation=True, max_length=TEXT_LENGTH, add_special_tokens=False).input_ids)

    @classmethod
    def set_schedule(cls, scheduler, spec, image_seq_len: int) -> None:
        """The pipelines' schedule: σ = linspace(1, 0, T + 1)[:-1], shifted by the checkpoint's static shift, then 0."""
        import numpy as np

        steps = spec.num_inference_steps
        scheduler.set_timesteps(sigmas=np.linspace(1.0, 0.0, steps + 1)[:-1])

    @staticmethod
    def vae_scale_factor(model_path: str | Path) -> int:
        """Pixels per latent cell: the VAE's ``spatial_compression_ratio`` (16)."""
        config = json.loads((Path(model_path) / "vae" / "config.json").read_text())
        return int(config["spatial_compression_ratio"])

    @classmethod
    def schedule_seq_len(cls, latents: torch.Tensor) -> int:
        """Transformer tokens of ``[B, C, F', h, w]`` latents (1x1 patches); the static shift does not read it."""
        return int(latents.shape[2] * latents.shape[3] * latents.shape[4])

    @classmethod
    def condition(cls, latents: torch.Tensor, batch) -> torch.Tensor:
        """``[B, C + 1, F', h, w]`` beside the latents: zeros in text to video."""
        b, c, *grid = latents.shape
        return latents.new_zeros((b, c + 1, *grid))

    @classmethod
    def image_embeds(cls, module, batch, latents: torch.Tensor) -> torch.Tensor:
        """The image stream: zeros of the transformer's image width in text to video (masked out entirely)."""
        width = module.config.image_embed_dim
        return latents.new_zeros((latents.shape[0], T2V_IMAGE_TOKENS, width))

    @classmethod
    def step_velocity(cls, module, batch, step: int, spec, vae_scale_factor: int) -> torch.Tensor:
        """Velocity ``[B, C, F', h, w]`` at recorded step ``step``; classic CFG when ``spec.uses_cfg``."""
        latents = batch["all_latents"][:, step]
        timestep = batch["all_timesteps"][:, step].to(latents.dtype)
        hidden = torch.cat([latents, cls.condition(latents, batch).to(latents.dtype)], dim=1)
        image = cls.image_embeds(module, batch, latents).to(latents.dtype)

        def forward(prefix: str) -> torch.Tensor:
            streams = _streams(batch, prefix, latents.dtype)
            return module(hidden_states=hidden, timestep=timestep, image_embeds=image, return_dict=False, **streams)[0]

        velocity = forward("")
        if spec.uses_cfg:
            velocity = classic_cfg(velocity, forward("negative_"), spec.true_cfg_scale)
        return velocity


@register_model_adapter("HunyuanVideo15ImageToVideoPipeline")
class HunyuanVideo15I2VTrainingAdapter(HunyuanVideo15TrainingAdapter):
    """Training adapter for ``HunyuanVideo15ImageToVideoPipeline`` checkpoints (HunyuanVideo-1.5 image to video)."""

    rollout_pipeline = "verl_omni.pipelines.hunyuan_video_1_5.rollout_pipeline.HunyuanVideo15I2VLogProbPipeline"
    lora_file_pipeline = "HunyuanVideo15ImageToVideoPipeline"
    conditioning_keys = HunyuanVideo15TrainingAdapter.conditioning_keys + ("image_condition", "image_embeds")
    # the first frame: one source image per prompt row (data.image_key)
    max_source_images = 1

    @classmethod
    def condition(cls, latents: torch.Tensor, batch) -> torch.Tensor:
        """Each sample's recorded ``image_condition``: the source image's latents on the first frame, then the mask."""
        return batch["image_condition"]

    @classmethod
    def image_embeds(cls, module, batch, latents: torch.Tensor) -> torch.Tensor:
        """Each sample's recorded SigLIP states of its source image."""
        return batch["image_embeds"]

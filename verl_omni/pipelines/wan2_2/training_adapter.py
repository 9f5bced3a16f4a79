"""Wan2.2 text-to-video on the training side: the diffusers 3-D DiT predicts the velocity of one step.

The velocity is what vLLM-Omni's ``Wan22Pipeline.diffuse`` computes per step in text-to-video mode:
the transformer on latents ``[B, C, F', h, w]`` (F' = (F − 1)/4 + 1 latent frames, h = H/16, w = W/16
for the TI2V-5B VAE) at the scheduler's timestep 1000σ (one value per sample), with the UMT5 prompt
embeddings zero-padded to :data:`TEXT_LENGTH` tokens (the padding rows take part in the
cross-attention, so their count matters); classic CFG v_neg + w·(v_pos − v_neg), no rescale. The
schedule is vLLM-Omni's Euler one (``WanEulerScheduler``): σ_i = shift(1 − i/T) for i < T and
σ_T = 0, with the checkpoint's flow shift (:func:`flow_shift`), which the replay rebuilds on the
flow-match scheduler.

Recorded per sample (unpacked: a video latent has no 2×2 token packing to share with the image
models): ``all_latents`` ``[W+1, C, F', h, w]``, ``all_timesteps`` ``[W]``, ``prompt_embeds``
``[L, D]`` (the encoder's last hidden states of the real tokens) and ``prompt_embeds_mask`` ``[L]``;
with CFG the negatives of the same shapes (the empty negative prompt unless one is sent).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from verl_omni.pipelines.diffusers_adapter import DiffusersFlowMatchAdapter, classic_cfg
from verl_omni.pipelines.model_base import register_model_adapter

# UMT5 tokens the prompt embeddings are zero-padded to (vLLM-Omni's and diffusers' ``max_sequence_length``)
TEXT_LENGTH = 512
# the flow shift when the checkpoint's scheduler config names none (vLLM-Omni's Wan default)
DEFAULT_FLOW_SHIFT = 5.0
# the scheduler's timestep range: an expert boundary ratio r is the timestep 1000·r
NUM_TRAIN_TIMESTEPS = 1000
# the A14B's experts: the pipeline's components, the trained module's attributes and the LoRA names' first part
EXPERTS = ("transformer", "transformer_2")


def flow_shift(model_path: str | Path) -> float:
    """The checkpoint's flow shift: ``flow_shift`` of its (UniPC) scheduler config, or ``shift`` of a flow-match one."""
    config = json.loads((Path(model_path) / "scheduler" / "scheduler_config.json").read_text())
    return float(config.get("flow_shift", config.get("shift", DEFAULT_FLOW_SHIFT)))


def padded_text(embeds: torch.Tensor, mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[B, L, D]`` recorded embeddings (padding zeroed by ``mask``) zero-padded to ``[B, TEXT_LENGTH, D]``."""
    embeds = embeds.to(dtype) * mask.to(dtype)[..., None]
    return torch.nn.functional.pad(embeds, (0, 0, 0, TEXT_LENGTH - embeds.shape[1]))


@register_model_adapter("WanPipeline")
class Wan22TrainingAdapter(DiffusersFlowMatchAdapter):
    """Training adapter for ``WanPipeline`` text-to-video checkpoints with one transformer (Wan2.2 TI2V-5B)."""

    rollout_pipeline = "verl_omni.pipelines.wan2_2.rollout_pipeline.Wan22LogProbPipeline"
    transformer_class = "WanTransformer3DModel"
    guidance_style = "cfg"
    # the released TI2V-5B example's guidance_scale
    default_true_cfg_scale = 5.0
    # 16 pixels per latent cell (2x2 patchify x 8x VAE) x 2x2 transformer patches; 4 frames per latent frame
    latent_multiple = 32
    frame_multiple = 4
    # the TI2V-5B model card's frame rate (720p at 24 fps)
    video_fps = 24
    # one sample's latent per step: [C, F', h, w]
    latent_ndim = 4
    tokenizer_subfolder = "tokenizer"
    lora_file_pipeline = "WanPipeline"
    conditioning_keys = ("prompt_embeds", "prompt_embeds_mask")
    cfg_conditioning_keys = ("negative_prompt_embeds", "negative_prompt_embeds_mask")
    # vLLM-Omni keeps ``to_out`` a single layer; its LoRA manager routes self-attention ``to_q``... adapters to the
    # fused ``attn1.to_qkv`` itself (the transformer's ``stacked_params_mapping``)
    rollout_name_map = ((".to_out.0.", ".to_out."),)
    fsdp_wrap_blocks = ("WanTransformerBlock",)
    lora_target_modules = ("to_q", "to_k", "to_v", "to_out.0")
    # the replay may split each sample's video tokens over a sequence-parallel group (the text stays whole)
    supports_sequence_parallel = True
    # vLLM-Omni's Wan2.2 transformer splits its video tokens over the replica's workers (its _sp_plan)
    rollout_supports_sequence_parallel = True

    @classmethod
    def for_checkpoint(cls, model_path: str | Path) -> type[Wan22TrainingAdapter]:
        """The two-expert adapter for a checkpoint with ``transformer_2/`` (A14B), this one otherwise (TI2V-5B)."""
        return Wan22A14BTrainingAdapter if (Path(model_path) / "transformer_2").is_dir() else cls

    @classmethod
    def prompt_token_ids(cls, tokenizer, prompt: str) -> list[int]:
        """Ids of the whitespace-normalised prompt as the pipelines tokenize it (``</s>`` added), no padding."""
        text = " ".join(prompt.strip().split())
        return list(tokenizer(text, truncation=True, max_length=TEXT_LENGTH, add_special_tokens=True).input_ids)

    @classmethod
    def build_scheduler(cls, model_path: str | Path):
        """A flow-match scheduler with the checkpoint's flow shift (the released checkpoint ships a UniPC config)."""
        from verl_omni.pipelines.schedulers import FlowMatchSDEDiscreteScheduler

        return FlowMatchSDEDiscreteScheduler(num_train_timesteps=1000, shift=flow_shift(model_path))

    @classmethod
    def set_schedule(cls, scheduler, spec, image_seq_len: int) -> None:
        """vLLM-Omni's Euler schedule (``WanEulerScheduler``): σ_i = shift(1 − i/T), i < T, then 0 (the scheduler
        applies its shift to the linear σ it is given and appends the 0)."""
        steps = spec.num_inference_steps
        scheduler.set_timesteps(sigmas=torch.linspace(1.0, 0.0, steps + 1)[:-1].numpy())

    @staticmethod
    def vae_scale_factor(model_path: str | Path) -> int:
        """Pixels per latent cell: the Wan VAE's ``scale_factor_spatial`` (16 for TI2V-5B, patchify included)."""
        config = json.loads((Path(model_path) / "vae" / "config.json").read_text())
        return int(config["scale_factor_spatial"])

    @classmethod
    def schedule_seq_len(cls, latents: torch.Tensor) -> int:
        """Transformer tokens of ``[B, C, F', h, w]`` latents (2×2 patches); the static shift does not read it."""
        return int(latents.shape[2] * (latents.shape[3] // 2) * (latents.shape[4] // 2))

    @classmethod
    def transformer_input(cls, latents: torch.Tensor, batch) -> torch.Tensor:
        """The transformer's ``hidden_states`` at latents ``[B, C, F', h, w]``: the latents themselves in text-to-video;
        an image-to-video model concatenates what conditions them (``verl_omni.pipelines.wan2_2_i2v``)."""
        return latents

    @classmethod
    def step_velocity(cls, module, batch, step: int, spec, vae_scale_factor: int) -> torch.Tensor:
        """Velocity ``[B, C, F', h, w]`` at recorded step ``step``; classic CFG when ``spec.uses_cfg``."""
        latents = batch["all_latents"][:, step]
        timestep = batch["all_timesteps"][:, step].to(latents.dtype)
        hidden = cls.transformer_input(latents, batch)  # once for both CFG passes

        def forward(prefix: str) -> torch.Tensor:
            text = padded_text(batch[f"{prefix}prompt_embeds"], batch[f"{prefix}prompt_embeds_mask"], latents.dtype)
            return module(hidden_states=hidden, timestep=timestep, encoder_hidden_states=text, return_dict=False)[0]

        velocity = forward("")
        if spec.uses_cfg:
            velocity = classic_cfg(velocity, forward("negative_"), spec.true_cfg_scale)
        return velocity


class Wan22A14BTrainingAdapter(Wan22TrainingAdapter):
    """Wan2.2 T2V-A14B (two experts, Wan2.1's 8x VAE): found by :meth:`Wan22TrainingAdapter.for_checkpoint`.

    A recorded step is replayed by the expert that sampled it: ``transformer`` when its timestep is at least
    ``boundary_ratio · 1000``, ``transformer_2`` below (vLLM-Omni's ``Wan22Pipeline.diffuse`` rule). The training
    module is :class:`WanExperts`: one LoRA config on both experts, one FSDP2 root over both (each expert's blocks a
    unit), LoRA tensors named ``transformer.…`` / ``transformer_2.…`` end to end: the rollout's LoRA manager looks
    its layers up by those full names first (both components are in its default list), and the checkpoint writes
    one diffusers file per expert (``lora_components``). Full fine-tuning is not built (no full-weight sync).
    """

    # 8 pixels per latent cell (Wan2.1's VAE, no patchify) x 2x2 transformer patches
    latent_multiple = 16
    # the released T2V-A14B's model_index.json
    boundary_ratio = 0.875
    default_true_cfg_scale = 4.0
    # the released A14B configs' sample_fps (the TI2V-5B's is 24): what the validation mp4s play at
    video_fps = 16
    lora_components = EXPERTS
    # the full-weight sync sends one component's tensors: the experts' LoRA only (full fine-tuning is refused)
    rollout_weight_prefix = None

    @classmethod
    def for_checkpoint(cls, model_path: str | Path) -> type[Wan22TrainingAdapter]:
        return cls

    @classmethod
    def build_module(cls, model_path: str | Path, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
        import diffusers

        from verl_omni.pipelines.wan2_2.experts import WanExperts

        load = getattr(diffusers, cls.transformer_class).from_pretrained
        root = Path(model_path)
        return WanExperts(*(load(root / expert, torch_dtype=dtype) for expert in EXPERTS))

    @classmethod
    def high_noise(cls, timesteps: torch.Tensor) -> torch.Tensor:
        """``[B]`` bool: which recorded timesteps the high-noise expert (``transformer``) sampled."""
        return timesteps >= cls.boundary_ratio * NUM_TRAIN_TIMESTEPS

    @classmethod
    def step_velocity(cls, module, batch, step: int, spec, vae_scale_factor: int) -> torch.Tensor:
        """The one-transformer velocity, each sample's from the expert that sampled its step ``step``.

        An expert that no local sample needs but another rank's does runs on this rank's first sample, its output
        joining the graph times 0 (:func:`agreed_experts`).
        """
        from verl_omni.pipelines.wan2_2.experts import WanExperts, agreed_experts

        high = cls.high_noise(batch["all_timesteps"][:, step])
        masks = (high, ~high)
        keys = [k for k in ("all_latents", "all_timesteps", *cls.recorded_keys()) if k in batch.keys()]
        runs = agreed_experts([bool(rows.any()) for rows in masks], high.device)
        velocity, idle = None, []
        for expert, rows, run in zip(EXPERTS, masks, runs, strict=True):
            if not run:
                continue
            # another rank's samples need this expert: run it on the first sample, weight 0
            part_rows = rows if bool(rows.any()) else torch.arange(len(rows), device=rows.device) == 0
            call = WanExperts.caller(module, expert)
            part = super().step_velocity(call, {k: batch[k][part_rows] for k in keys}, step, spec, vae_scale_factor)
            if not bool(rows.any()):
                idle.append(part)
                continue
            if velocity is None:
                velocity = part.new_zeros((len(rows), *part.shape[1:]))
            velocity[rows] = part
        for part in idle:
            velocity = velocity + 0.0 * part.sum()
        return velocity

"""BAGEL on the training side: build the generation module, rebuild BAGEL's schedule, replay one step.

BAGEL is not a diffusers model: the trainable module is
:class:`~verl_omni.pipelines.bagel.modeling.BagelForGeneration`, built from the same checkpoint
files the rollout loads (``ema.safetensors`` + configs). Only the generation expert is trained
(LoRA on its MLP by default); the understanding expert, which builds the text context, stays frozen.

The rollout records, per sample, the prompt token ids (and the negative prompt's under text CFG);
the replay prefills them again with the frozen understanding expert and predicts the guided
velocity with BAGEL's CFG. BAGEL's schedule is ``num_inference_steps + 1`` points of
``linspace(1, 0)`` under the timestep shift ``s·t / (1 + (s − 1)·t)``, the last one σ = 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from verl_omni.pipelines.bagel.modeling import BagelForGeneration, Guidance
from verl_omni.pipelines.model_base import ModelAdapter, register_model_adapter

DEFAULT_TIMESTEP_SHIFT = 3.0
# CFG defaults of BAGEL's text-to-image; the text-CFG scale itself is the replay's ``true_cfg_scale``
DEFAULT_GUIDANCE = {
    "cfg_img_scale": 1.0,
    "cfg_interval": (0.4, 1.0),
    "cfg_renorm_type": "global",
    "cfg_renorm_min": 0.0,
}


def prompt_token_ids(tokenizer, prompt: str) -> list[int]:
    """Token ids the BAGEL rollout expects for ``prompt``: ``<|im_start|>`` text ``<|im_end|>``, as BAGEL frames a turn.

    An empty prompt is no ids: BAGEL's text-unconditional CFG branch is the empty context (as vLLM-Omni's
    pipeline does with an empty negative prompt).
    """
    if not prompt:
        return []
    start, end = tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    return [start, *tokenizer.encode(prompt, add_special_tokens=False), end]


def bagel_sigmas(num_inference_steps: int, timestep_shift: float) -> torch.Tensor:
    """The ``num_inference_steps + 1`` shifted sigmas (fp32, from 1 down to 0) BAGEL samples with."""
    if num_inference_steps < 1:
        raise ValueError(f"num_inference_steps must be >= 1, got {num_inference_steps}")
    if not timestep_shift > 0:
        raise ValueError(f"timestep_shift must be > 0, got {timestep_shift}")
    t = torch.linspace(1, 0, num_inference_steps + 1)
    return timestep_shift * t / (1 + (timestep_shift - 1) * t)


def set_bagel_schedule(scheduler, num_inference_steps: int, timestep_shift: float) -> None:
    """Point a flow-match scheduler at BAGEL's schedule; its timesteps are the sigmas themselves (σ ∈ (0, 1])."""
    sigmas = bagel_sigmas(num_inference_steps, timestep_shift)
    scheduler.sigmas = sigmas
    scheduler.timesteps = sigmas[:-1].clone()
    scheduler.num_inference_steps = num_inference_steps
    scheduler._step_index = None
    scheduler._begin_index = None


def guidance_from(settings: Mapping, text_scale: float) -> Guidance:
    """BAGEL's CFG from request / replay settings (missing keys take :data:`DEFAULT_GUIDANCE`)."""
    merged = {**DEFAULT_GUIDANCE, **{k: v for k, v in settings.items() if k in DEFAULT_GUIDANCE}}
    return Guidance(
        text_scale=float(text_scale),
        image_scale=float(merged["cfg_img_scale"]),
        interval=tuple(float(x) for x in merged["cfg_interval"]),
        renorm_type=str(merged["cfg_renorm_type"]),
        renorm_min=float(merged["cfg_renorm_min"]),
    )


def _rows(batch: Mapping[str, torch.Tensor], key: str) -> list[torch.Tensor]:
    """Per-sample token ids without padding, from ``key`` ``[B, L]`` and ``{key}_mask`` ``[B, L]``."""
    ids, mask = batch[key], batch[f"{key}_mask"].bool()
    return [row[m].long() for row, m in zip(ids, mask, strict=True)]


@register_model_adapter("BagelForConditionalGeneration")
class BagelTrainingAdapter(ModelAdapter):
    """Training adapter for BAGEL checkpoints (``config.json`` architecture ``BagelForConditionalGeneration``)."""

    rollout_pipeline = "verl_omni.pipelines.bagel.rollout_pipeline.BagelPipelineWithLogProb"
    fsdp_wrap_blocks = ("MoTDecoderLayer",)
    # the generation expert's MLP: plain (gate_up / down) layers in vLLM-Omni, so LoRA binds there in the
    # rollout too; the generation expert's attention projections live inside vLLM-Omni's fused MoT layers,
    # which its LoRA manager does not wrap
    lora_target_modules = ("mlp_moe_gen.gate_proj", "mlp_moe_gen.up_proj", "mlp_moe_gen.down_proj")
    conditioning_keys = ("prompt_token_ids", "prompt_token_ids_mask")
    cfg_conditioning_keys = ("negative_prompt_token_ids", "negative_prompt_token_ids_mask")
    # vLLM-Omni's LoRA manager names the language model's layers relative to ``transformer`` (its
    # ``language_model.model``); gate/up are fused there and matched through packed_modules_mapping
    rollout_name_map = ((".language_model.model.", "."),)
    # no full-weight sync yet: BAGEL's pipeline loader expects the checkpoint's names, not the trained module's
    rollout_weight_prefix = None
    # BAGEL's schedule shift and CFG settings (rollout.model_kwargs), besides the text-CFG scale true_cfg_scale
    sampling_keys = ("timestep_shift", *DEFAULT_GUIDANCE)
    # the released checkpoint keeps its Qwen2 tokenizer files at the root
    tokenizer_subfolder = ""
    # vLLM-Omni's BAGEL casts activations to bf16 inside its layers: it cannot run in fp32, even on CPU
    rollout_dtype = "bfloat16"
    # 8x VAE, latents patched 2x2: image sides divide by 16 (the checkpoint's latent table also caps them)
    latent_multiple = 16
    # BAGEL's own denoising loop (``generate_image``) takes every step of its schedule and each step through the
    # recorder's SDE/Euler step: it cannot thin the steps after the window or run DPM-Solver++ there (MixGRPO-Flash)
    sampler_choices = {"ode_solver": ("euler",), "ode_post_window_ratio": (1.0,)}
    # text CFG against an empty context, renormalized (cfg_renorm_type); the scale is true_cfg_scale
    guidance_style = "true_cfg"
    default_true_cfg_scale = 4.0

    @classmethod
    def prompt_token_ids(cls, tokenizer, prompt: str) -> list[int]:
        return prompt_token_ids(tokenizer, prompt)

    @classmethod
    def build_module(cls, model_path: str | Path, dtype: torch.dtype = torch.float32) -> BagelForGeneration:
        return BagelForGeneration.from_pretrained(model_path, dtype=dtype)

    @classmethod
    def build_scheduler(cls, model_path: str | Path):
        from verl_omni.pipelines.schedulers import FlowMatchSDEDiscreteScheduler

        # BAGEL ships no scheduler config: its schedule is set explicitly (set_schedule)
        return FlowMatchSDEDiscreteScheduler()

    @classmethod
    def set_schedule(cls, scheduler, spec, image_seq_len: int) -> None:
        shift = float(spec.model_kwargs.get("timestep_shift", DEFAULT_TIMESTEP_SHIFT))
        set_bagel_schedule(scheduler, spec.num_inference_steps, shift)

    @classmethod
    def step_velocity(cls, module, batch, step: int, spec, vae_scale_factor: int = 1) -> torch.Tensor:
        """Guided velocity ``[B, S, C]`` at recorded step ``step`` (one forward of the possibly sharded module)."""
        negative = _rows(batch, "negative_prompt_token_ids") if spec.uses_cfg else None
        return module(
            batch["all_latents"][:, step],
            batch["all_timesteps"][:, step],
            _rows(batch, "prompt_token_ids"),
            negative,
            spec.height,
            spec.width,
            guidance_from(spec.model_kwargs, spec.true_cfg_scale),
        )

"""Wan2.2 I2V-A14B on the training side: the T2V A14B's two experts with the source image's condition on channels.

Every transformer pass of diffusers' and vLLM-Omni's ``WanImageToVideoPipeline`` (the A14B: no CLIP image embedding,
no ``expand_timesteps``) reads ``cat([latents, condition], dim=1)``: the noise latents ``[C, F', h, w]`` followed by
the condition ``[4 + C, F', h, w]``, which is the first-frame mask (4 channels, one per frame of a latent frame:
ones on the first frame, zeros after) and the VAE latents (normalised by the VAE's mean and std, the distribution's
mode) of the source image followed by black frames. The rollout records that condition once per request as
``image_condition`` and the replay concatenates it as recorded. Everything else is the T2V A14B's
(:class:`~verl_omni.pipelines.wan2_2.training_adapter.Wan22A14BTrainingAdapter`): the UMT5 text, classic CFG, the
Euler schedule with the checkpoint's flow shift, each step replayed by the expert that sampled it, one LoRA over
both experts.
"""

from __future__ import annotations

from pathlib import Path

import torch

from verl_omni.pipelines.model_base import register_model_adapter
from verl_omni.pipelines.wan2_2.training_adapter import Wan22A14BTrainingAdapter, Wan22TrainingAdapter


@register_model_adapter("WanImageToVideoPipeline")
class Wan22I2VA14BTrainingAdapter(Wan22A14BTrainingAdapter):
    """Training adapter for ``WanImageToVideoPipeline`` checkpoints with two experts (Wan2.2 I2V-A14B)."""

    rollout_pipeline = "verl_omni.pipelines.wan2_2_i2v.rollout_pipeline.Wan22I2VLogProbPipeline"
    lora_file_pipeline = "WanImageToVideoPipeline"
    # the released I2V-A14B's model_index.json (its original config's boundary 0.900)
    boundary_ratio = 0.9
    # the released config's sample_guide_scale (3.5, 3.5): one scale serves both experts
    default_true_cfg_scale = 3.5
    conditioning_keys = Wan22TrainingAdapter.conditioning_keys + ("image_condition",)
    # the first frame: one source image per prompt row (data.image_key)
    max_source_images = 1

    @classmethod
    def for_checkpoint(cls, model_path: str | Path) -> type[Wan22I2VA14BTrainingAdapter]:
        """This adapter for a two-expert checkpoint; the one-transformer image-to-video checkpoints (Wan2.1's I2V with
        a CLIP image encoder, the TI2V-5B's ``expand_timesteps`` layout) condition otherwise and are refused."""
        if not (Path(model_path) / "transformer_2").is_dir():
            raise ValueError(
                f"model.path={model_path!s}: a WanImageToVideoPipeline without transformer_2/ (Wan2.1 I2V, Wan2.2 "
                f"TI2V-5B as I2V) is not built; {cls.__name__} trains the two-expert Wan2.2 I2V-A14B "
                "(Wan-AI/Wan2.2-I2V-A14B-Diffusers). The TI2V-5B trains as WanPipeline (text to video)"
            )
        return cls

    @classmethod
    def transformer_input(cls, latents: torch.Tensor, batch) -> torch.Tensor:
        """``[B, 2C + 4, F', h, w]``: the latents, then each sample's recorded ``image_condition``."""
        return torch.cat([latents, batch["image_condition"].to(latents.dtype)], dim=1)

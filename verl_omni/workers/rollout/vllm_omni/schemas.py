"""What a diffusion rollout returns per sample (DESIGN.md §3)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class DiffusionOutput:
    """One generated sample.

    Args:
        diffusion_output (`torch.Tensor`, uint8): the image ``[3, H, W]`` or the video ``[F, 3, H, W]``.
        rollout_log_probs (`torch.Tensor`, ``[W]``): log-probs of the W recorded SDE transitions (the
            trainer's batch key of the same name).
        extra_fields (`dict`): ``all_latents`` [W+1, ...] (packed tokens ``[S, C]`` per step for images, the
            video latent ``[C, F', h, w]`` for video), ``all_timesteps`` [W], ``window_start``,
            ``prompt_embeds`` [L, D], ``prompt_embeds_mask`` [L] and, with CFG,
            ``negative_prompt_embeds`` / ``negative_prompt_embeds_mask``.
        stop_reason (`str`): ``"completed"`` or ``"aborted"``.
        num_preempted (`int` or None): kept for parity with verl's ``TokenOutput`` metrics.
    """

    diffusion_output: torch.Tensor
    rollout_log_probs: torch.Tensor
    extra_fields: dict[str, Any] = field(default_factory=dict)
    stop_reason: str = "completed"
    num_preempted: int | None = None

"""MixGRPO (Li et al., 2025, arXiv:2507.21802): SDE inside a window that slides with training, ODE outside it,
GRPO on the window's steps only (``docs/design.md``, "MixGRPO").

What differs from Flow-GRPO, and where it lives:

* the sampler: one window of ``sde_window_size`` steps for every sample of a training step, moved by
  ``sde_window_stride`` every ``sde_window_shift_every`` steps (``actor_rollout_ref.rollout.sde_window_schedule=
  progressive``, :func:`verl_omni.pipelines.schedulers.mix_ode.progressive_window_start`); the Euler ODE
  outside it, or, for MixGRPO-Flash, DPM-Solver++ on a thinned schedule after it (``ode_solver=dpmsolver++``,
  ``ode_post_window_ratio``); :meth:`MixGRPO.check` refuses a per-sample random window;
* the trained steps: the window's, which are exactly the recorded ones (the frame's default);
* the advantage: each prompt group normalized by its own std, as the authors' code (derived from
  DanceGRPO's) does, :func:`~verl_omni.algorithms.dance_grpo.compute_dance_grpo_advantage`.

The loss of a window step is Flow-GRPO's clipped ratio (``actor.clip_ratio``; the authors: 1e-4) on the
authors' default SDE step, Flow-GRPO's ``sde`` (their ``--flow_grpo_sampling``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from verl_omni.algorithms.base import SDE_WINDOW, Algorithm, AlgorithmConfig, register_algorithm
from verl_omni.algorithms.dance_grpo import ROLLOUT, compute_dance_grpo_advantage
from verl_omni.algorithms.flow_grpo import FlowGRPOLoss


@dataclass
class MixGRPOConfig(AlgorithmConfig):
    """MixGRPO's advantage (``algorithm=mix_grpo``); its window and ODE are sampling settings of the rollout.

    Args:
        name (str): ``mix_grpo``.
        epsilon (float): added to each group's std (the authors: 1e-8).
        adv_clip_max (float): advantages are clipped to ±adv_clip_max (the authors: 5).
    """

    name: str = "mix_grpo"
    epsilon: float = 1e-8
    adv_clip_max: float = 5.0

    def __post_init__(self):
        super().__post_init__()
        self.require_positive("epsilon", "adv_clip_max")


@register_algorithm("mix_grpo")
class MixGRPO(Algorithm):
    """MixGRPO: ``algorithm=mix_grpo`` with ``actor_rollout_ref.rollout.sde_window_schedule=progressive``."""

    title = "MixGRPO"
    config_cls = MixGRPOConfig
    loss_cls = FlowGRPOLoss
    rollout_record = SDE_WINDOW

    @classmethod
    def compute_advantage(cls, scores: torch.Tensor, index: Sequence, config: MixGRPOConfig) -> torch.Tensor:
        return compute_dance_grpo_advantage(scores, index, config.epsilon, config.adv_clip_max)

    @classmethod
    def check(cls, configs) -> None:
        """The window must be MixGRPO's: one per training step, sliding with it."""
        rollout = configs.rollout
        if rollout.sde_window_schedule != "progressive":
            raise ValueError(
                f"algorithm=mix_grpo slides one SDE window with training: set {ROLLOUT}.sde_window_schedule="
                f"progressive (got {rollout.sde_window_schedule!r}); the authors: {ROLLOUT}.sde_window_size=4, "
                f"sde_window_stride=1, sde_window_shift_every=25 (MixGRPO-Flash: ode_solver=dpmsolver++, "
                "ode_post_window_ratio=0.4; docs/guide/algorithms.md)"
            )
        if rollout.sde_window_size >= rollout.num_inference_steps:
            raise ValueError(
                f"algorithm=mix_grpo: {ROLLOUT}.sde_window_size={rollout.sde_window_size} covers all "
                f"num_inference_steps={rollout.num_inference_steps}: the window cannot slide; choose a smaller window"
            )

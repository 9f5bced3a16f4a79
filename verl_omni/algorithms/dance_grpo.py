"""DanceGRPO (Xue et al., 2025, arXiv:2505.07818): GRPO on the rectified-flow SDE, trained on a random fraction
of the denoising steps (``docs/design.md``, "DanceGRPO").

What differs from Flow-GRPO, and where it lives:

* the sampler: DanceGRPO's SDE step and log-prob (``actor_rollout_ref.rollout.sde_type=dance``,
  :mod:`verl_omni.pipelines.schedulers.flow_match_sde`), every step stochastic in the authors' recipe
  (``sde_window_size`` = ``num_inference_steps``) and one initial noise per prompt group
  (``same_initial_noise=true``); :meth:`DanceGRPO.check` refuses another sde type;
* the advantage: each prompt group normalized by its own (unbiased) std, :func:`compute_dance_grpo_advantage`;
* the trained steps: a random ``timestep_fraction`` of the recorded steps, the last one excluded
  (``ignore_last``), drawn anew for every update call, :meth:`DanceGRPOLoss.replay_steps`.

The loss of a trained step is Flow-GRPO's clipped ratio (``actor.clip_ratio``; the authors: 1e-4).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from verl_omni.algorithms.base import SDE_WINDOW, Algorithm, AlgorithmConfig, register_algorithm
from verl_omni.algorithms.flow_grpo import FlowGRPOLoss

ROLLOUT = "actor_rollout_ref.rollout"


def compute_dance_grpo_advantage(
    scores: torch.Tensor, index: Sequence, epsilon: float = 1e-8, adv_clip_max: float = 5.0
) -> torch.Tensor:
    """A_i = (r_i − mean of i's group) / (unbiased std of i's group + ε), clipped to ±adv_clip_max.

    The authors normalize every group by its own sample std (``torch.std``, ddof=1) and clip the advantage
    in the loss; a group of one sample (std undefined) gets 0 here, a group of equal rewards 0 as well.

    Args:
        scores (`torch.Tensor`, ``[B]``): one reward per sample.
        index (sequence of length B): each sample's group id (the prompt's ``uid``).
        epsilon: added to the std.
        adv_clip_max: the clip of the advantage.
    """
    if scores.ndim != 1:
        raise ValueError(f"scores must be 1-D [B], got shape {tuple(scores.shape)}")
    if not bool(torch.isfinite(scores).all()):
        raise ValueError("scores contain NaN or inf; a reward scorer failed to produce a value")
    if len(index) != len(scores):
        raise ValueError(f"index has {len(index)} group ids for {len(scores)} scores")
    r = scores.detach().to(torch.float64).cpu()
    ids = np.asarray([str(i) for i in index])
    adv = torch.zeros_like(r)
    for gid in dict.fromkeys(ids.tolist()):
        members = torch.as_tensor(np.flatnonzero(ids == gid))
        if len(members) < 2:
            continue
        group = r[members]
        adv[members] = (group - group.mean()) / (group.std(unbiased=True) + epsilon)
    return adv.clamp(-adv_clip_max, adv_clip_max).to(torch.float32).to(scores.device)


@dataclass
class DanceGRPOConfig(AlgorithmConfig):
    """DanceGRPO's advantage and trained steps (``algorithm=dance_grpo``).

    Args:
        name (str): ``dance_grpo``.
        epsilon (float): added to each group's std (the authors: 1e-8).
        adv_clip_max (float): advantages are clipped to ±adv_clip_max (the authors: 5).
        timestep_fraction (float): share of the recorded steps trained per update, in (0, 1] (the authors: 0.6).
        ignore_last (bool): never train the last recorded step (the authors' ``--ignore_last``).
        seed (int): seed of the trained steps' draws (the same on every rank).
    """

    name: str = "dance_grpo"
    epsilon: float = 1e-8
    adv_clip_max: float = 5.0
    timestep_fraction: float = 0.6
    ignore_last: bool = True
    seed: int = 0

    def __post_init__(self):
        super().__post_init__()
        self.require_positive("epsilon", "adv_clip_max")
        self.require_fraction("timestep_fraction")


class DanceGRPOLoss(FlowGRPOLoss):
    """Flow-GRPO's clipped ratio on a random ``timestep_fraction`` of the recorded steps.

    The authors draw a permutation of the steps per sample and train its first ``int(steps·fraction)``;
    the engine replays the same steps for every sample of an update call, so the draw here is one per
    call (each sample still trains a uniformly drawn fraction of its steps; the samples of a call share it).
    """

    def __init__(self, actor_config, algorithm_config: DanceGRPOConfig):
        super().__init__(actor_config, algorithm_config)
        self._generator = torch.Generator().manual_seed(int(algorithm_config.seed))

    def trained_step_count(self, num_steps: int) -> tuple[int, int]:
        """``(candidates, trained)``: the recorded steps that may be trained and how many of them are."""
        config = self.algorithm_config
        candidates = num_steps - 1 if config.ignore_last else num_steps
        if candidates < 1:
            raise ValueError(
                f"algorithm.ignore_last=true leaves no step of a {num_steps}-step window to train: raise "
                f"{ROLLOUT}.sde_window_size or set algorithm.ignore_last=false"
            )
        return candidates, max(1, int(candidates * config.timestep_fraction))

    def replay_steps(self, num_steps: int) -> Sequence[int]:
        candidates, trained = self.trained_step_count(num_steps)
        chosen = torch.randperm(candidates, generator=self._generator)[:trained]
        return sorted(int(i) for i in chosen)


@register_algorithm("dance_grpo")
class DanceGRPO(Algorithm):
    """DanceGRPO: ``algorithm=dance_grpo`` with ``actor_rollout_ref.rollout.sde_type=dance``."""

    title = "DanceGRPO"
    config_cls = DanceGRPOConfig
    loss_cls = DanceGRPOLoss
    rollout_record = SDE_WINDOW

    @classmethod
    def compute_advantage(cls, scores: torch.Tensor, index: Sequence, config: DanceGRPOConfig) -> torch.Tensor:
        return compute_dance_grpo_advantage(scores, index, config.epsilon, config.adv_clip_max)

    @classmethod
    def check(cls, configs) -> None:
        """The rollout must sample with DanceGRPO's SDE step (its log-prob is what the loss compares)."""
        if configs.rollout.sde_type != "dance":
            raise ValueError(
                f"algorithm=dance_grpo samples with DanceGRPO's SDE step: set {ROLLOUT}.sde_type=dance "
                f"(got {configs.rollout.sde_type!r}); the authors' recipe also sets {ROLLOUT}.same_initial_noise=true "
                f"and {ROLLOUT}.sde_window_size={ROLLOUT}.num_inference_steps (docs/guide/algorithms.md)"
            )

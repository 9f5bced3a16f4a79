"""Flow-GRPO (Liu et al., 2025, arXiv:2505.05470): group-normalized advantages, clipped ratio per SDE step.

The math lives in :mod:`verl_omni.algorithms.flow_grpo_math` (``docs/design.md``, "Advantage and loss
(Flow-GRPO)"); this module binds it to the algorithm contract: the ``algorithm`` node's dataclass, the per-step loss over a
replayed micro-batch, and the declarations the trainer reads (an SDE window with log-probs; the
old log-prob phase unless the rollout's are used; the reference phase when ``actor.kl_beta > 0``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from verl_omni.algorithms.base import (
    SDE_WINDOW,
    Algorithm,
    AlgorithmConfig,
    AlgorithmLoss,
    register_algorithm,
)
from verl_omni.algorithms.flow_grpo_math import compute_flow_grpo_advantage, compute_flow_grpo_policy_loss


@dataclass
class FlowGRPOAlgoConfig(AlgorithmConfig):
    """The group advantage of Flow-GRPO (``algorithm=flow_grpo``).

    Args:
        name (str): ``flow_grpo``.
        global_std (bool): normalize by the std over the whole batch (True) or per prompt group.
        epsilon (float): added to the std, so zero-variance groups get advantage 0.
        adv_clip_max (float): advantages are clipped to ±adv_clip_max.
    """

    name: str = "flow_grpo"
    global_std: bool = True
    epsilon: float = 1e-4
    adv_clip_max: float = 5.0

    def __post_init__(self):
        super().__post_init__()
        self.require_positive("epsilon", "adv_clip_max")


class FlowGRPOLoss(AlgorithmLoss):
    """Clipped ratio loss of one replayed SDE step (+ β·KL to the reference), and ``logprob_diff_max``.

    Reads log π_old ``[b, W]`` under ``actor.old_log_prob_key`` (``old_log_probs``, or the rollout's
    ``rollout_log_probs`` in bypass), ``advantages`` ``[b]`` and, when ``actor.kl_beta > 0``,
    ``ref_prev_sample_mean`` ``[b, W, N, C]``. In bypass with ``actor.rollout_correction.loss_type=reinforce`` the
    policy term is the truncated-importance-weight policy gradient instead of the clipped ratio.
    """

    metric_reductions = {
        "pg_loss": "mean",
        "kl_loss": "mean",
        "pg_clipfrac": "mean",
        "is_truncated_frac": "mean",
        "ppo_kl": "mean",
        "ratio_mean": "mean",
        "ratio_max_abs_dev": "max",
        "logprob_diff_max": "max",
    }
    # max |log π_θ − log π_old| compares with the rollout only before the first optimizer step
    first_epoch_metrics = ("logprob_diff_max",)

    def __init__(self, actor_config, algorithm_config):
        super().__init__(actor_config, algorithm_config)
        # the policy term reports the share it clipped or the share of weights it capped, never both
        unreported = "pg_clipfrac" if actor_config.rollout_is_truncated else "is_truncated_frac"
        self.metric_reductions = {k: v for k, v in type(self).metric_reductions.items() if k != unreported}

    @property
    def required_keys(self) -> tuple[str, ...]:
        actor = self.actor_config
        return (actor.old_log_prob_key, "advantages") + (("ref_prev_sample_mean",) if actor.kl_beta > 0 else ())

    def __call__(self, replayed, micro_batch, step: int) -> tuple[torch.Tensor, dict[str, float]]:
        self.check_batch(micro_batch)
        actor = self.actor_config
        old = micro_batch[actor.old_log_prob_key][:, step].to(replayed.log_prob)
        ref = micro_batch["ref_prev_sample_mean"][:, step] if actor.kl_beta > 0 else None
        loss, metrics = compute_flow_grpo_policy_loss(
            replayed.log_prob,
            old,
            micro_batch["advantages"].to(replayed.log_prob),
            clip_ratio=actor.clip_ratio,
            kl_beta=actor.kl_beta,
            prev_sample_mean=replayed.prev_sample_mean,
            ref_prev_sample_mean=ref,
            std_dev_t=replayed.std_dev_t,
            is_threshold=actor.rollout_correction.rollout_is_threshold if actor.rollout_is_truncated else None,
        )
        metrics["logprob_diff_max"] = (replayed.log_prob.detach() - old).abs().max().item()
        return loss, metrics


@register_algorithm("flow_grpo")
class FlowGRPO(Algorithm):
    """Flow-GRPO: the default algorithm (``algorithm=flow_grpo``)."""

    title = "Flow-GRPO"
    config_cls = FlowGRPOAlgoConfig
    loss_cls = FlowGRPOLoss
    rollout_record = SDE_WINDOW

    @classmethod
    def compute_advantage(cls, scores: torch.Tensor, index: Sequence, config: FlowGRPOAlgoConfig) -> torch.Tensor:
        return compute_flow_grpo_advantage(
            scores, index, global_std=config.global_std, epsilon=config.epsilon, adv_clip_max=config.adv_clip_max
        )

"""The per-step loss the engine calls while replaying (cf. ``verl.workers.utils.losses.ppo_loss``).

It binds a policy loss from the registry of :mod:`verl_omni.trainer.flowgrpo.core_algos` to the
fields of a replayed micro-batch; the loss math itself lives only there.
"""

from __future__ import annotations

import logging

import torch

from verl_omni.pipelines.schedulers.flow_match_sde import SDEStepOutput
from verl_omni.trainer.flowgrpo.core_algos import get_policy_loss_fn
from verl_omni.workers.config.actor import DiffusionActorConfig

logger = logging.getLogger(__name__)


def make_policy_loss(config: DiffusionActorConfig):
    """``loss(replayed, micro_batch, step) -> (loss, metrics)`` for the configured policy loss.

    The micro-batch carries log π_old ``[b, W]`` under ``config.old_log_prob_key`` (``old_log_probs``, or the
    rollout's ``rollout_log_probs`` in bypass), ``advantages`` ``[b]`` and, when
    ``kl_beta > 0``, ``ref_prev_sample_mean`` ``[b, W, N, C]``. Besides the loss's own metrics it
    reports ``logprob_diff_max`` = max |log π_θ − log π_old| of the step.
    """
    policy_loss = get_policy_loss_fn(config.policy_loss)
    old_key = config.old_log_prob_key

    def loss_fn(out: SDEStepOutput, micro_batch, step: int) -> tuple[torch.Tensor, dict[str, float]]:
        for key in (old_key, "advantages") + (("ref_prev_sample_mean",) if config.kl_beta > 0 else ()):
            if key not in micro_batch.keys():
                raise KeyError(
                    f"update batch lacks {key!r} (actor.kl_beta={config.kl_beta}, "
                    f"actor.use_rollout_log_probs={config.use_rollout_log_probs}); run its phase first"
                )
        old = micro_batch[old_key][:, step].to(out.log_prob)
        ref = micro_batch["ref_prev_sample_mean"][:, step] if config.kl_beta > 0 else None
        loss, metrics = policy_loss(
            out.log_prob,
            old,
            micro_batch["advantages"].to(out.log_prob),
            clip_ratio=config.clip_ratio,
            kl_beta=config.kl_beta,
            prev_sample_mean=out.prev_sample_mean,
            ref_prev_sample_mean=ref,
            std_dev_t=out.std_dev_t,
        )
        metrics["logprob_diff_max"] = (out.log_prob.detach() - old).abs().max().item()
        return loss, metrics

    return loss_fn

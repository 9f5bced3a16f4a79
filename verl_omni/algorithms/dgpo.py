"""Direct Group Preference Optimization (Luo, Hu and Tang, 2025, arXiv:2510.08425): ``algorithm=dgpo``.

DGPO keeps GRPO's group-relative advantage and drops the policy gradient: the rollout samples clean images with the
deterministic ODE (the ``ode_samples`` record, no log-probs), and the update trains a DPO likelihood that each prompt
group's positive sub-group (advantage > 0) is preferred to its negative one, the implicit reward of a sample being its
flow-matching error's improvement over the frozen reference (the loss and what it follows of the authors' code:
:mod:`~verl_omni.algorithms.dgpo_math`).

What the loss needs of the engine, and how it gets it:

* a whole prompt group in one micro-batch (a group's loss couples all its samples): :meth:`DGPO.arrange_update`
  lays the update rows out group by group, and the config check refuses a micro-batch that is not a multiple of
  ``rollout.n`` samples and shuffled mini-batches; the loss refuses a micro-batch holding part of a group;
* one σ and one ε for the whole group (their errors compare only at one noise, as the authors' ``use_shared_noise``):
  σ is the replayed schedule step's, one per forward; ε is drawn once per group (the replay's ``noise_group`` key,
  :func:`~verl_omni.workers.utils.replay.forward_noise`);
* the reference's errors at that same noise, without gradient: the replay runs the reference policy (the LoRA
  disabled, or full fine-tuning's frozen copy) in the update (``Phases.reference_in_update``).

Timesteps, as the authors: a few steps of the rollout's schedule from its noisiest part (their ``trunc_steps``: the
first half of a 10-step schedule), one σ for all the samples of a forward; drawn here one per stratum, per
mini-batch, as AWM and Diffusion-DPO draw them (:func:`~verl_omni.algorithms.awm.stratified_steps`), where the
authors draw them uniformly without replacement, once per inner epoch. The YAML samples without guidance (the
authors' CFG-free mode; their default samples with guidance and trains without).
``kl_coef`` is their optional velocity penalty mean‖v_θ − v_ref‖² (``train.beta``), on the reference velocity the
update already has. Not implemented: their PPO-style clip of the matching error against a fast EMA of the policy
(``clip_dsm``), sampling from that EMA after ``switch_ema_ref`` steps, and classifier-free guidance in the
reference's branch (``kl_cfg``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from verl_omni.algorithms.awm import stratified_steps
from verl_omni.algorithms.base import (
    NOISE_GROUP_KEY,
    Algorithm,
    AlgorithmConfig,
    AlgorithmLoss,
    UpdateRows,
    register_algorithm,
)
from verl_omni.algorithms.dgpo_math import group_preference_loss, group_rows
from verl_omni.algorithms.diffusion_dpo_math import velocity_matching_error
from verl_omni.algorithms.flow_grpo_math import _group_ids, compute_flow_grpo_advantage, zero_std_groups
from verl_omni.pipelines.model_base import ODE_SAMPLES

# per update row, int64 [B]: the number of rows of its prompt group in the update batch (the loss checks that a
# micro-batch holds each of its groups whole)
GROUP_SIZE_KEY = "group_size"


@dataclass
class DGPOConfig(AlgorithmConfig):
    """Direct Group Preference Optimization (``algorithm=dgpo``).

    Args:
        name (str): ``dgpo``.
        beta (float): β > 0, the scale of the implicit reward (the authors' ``beta_dpo``, 10 to 100 with a frozen
            reference): the larger, the sooner a group's weight σ(S) fades once the policy prefers its positive
            sub-group more than the reference does.
        global_std (bool): normalize rewards by the std over the whole batch (True) or per prompt group.
        epsilon (float): added to the std.
        adv_clip_max (float): advantages are clipped to ±adv_clip_max.
        timestep_fraction (float): the trained schedule steps are drawn from the first ``timestep_fraction`` of the
            T steps (the noisiest end), in (0, 1].
        num_train_steps (int): schedule steps trained on per mini-batch, one from each of that many equal strata of
            the allowed steps (at most their number), >= 1.
        kl_coef (float): weight >= 0 of the velocity penalty mean‖v_θ − v_ref‖² at the trained noise (0: none).
    """

    name: str = "dgpo"
    beta: float = 100.0
    global_std: bool = True
    epsilon: float = 1e-4
    adv_clip_max: float = 5.0
    timestep_fraction: float = 0.5
    num_train_steps: int = 4
    kl_coef: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        self.require_positive("beta", "epsilon", "adv_clip_max")
        self.require_fraction("timestep_fraction")
        if not (isinstance(self.num_train_steps, int) and self.num_train_steps >= 1):
            raise ValueError(f"algorithm.num_train_steps must be an integer >= 1, got {self.num_train_steps!r}")
        if not self.kl_coef >= 0:
            raise ValueError(f"algorithm.kl_coef must be >= 0 (0: no velocity penalty), got {self.kl_coef}")


def arrange_groups(scores: torch.Tensor, index: Sequence, drop_zero_std_groups: bool) -> UpdateRows:
    """The update rows of whole prompt groups, one after another (groups in order of first appearance, samples in
    batch order), each group's rows one noise group; with ``drop_zero_std_groups`` the rows of equal-reward groups
    are not trained (they add nothing but a constant: every advantage of theirs is 0)."""
    ids = _group_ids(index, len(scores))
    first = {}
    for group in ids.tolist():
        first.setdefault(group, len(first))
    group_of = torch.tensor([first[g] for g in ids.tolist()], dtype=torch.long)
    order = torch.argsort(group_of, stable=True)
    sizes = torch.bincount(group_of)
    equal, _ = zero_std_groups(scores, index)
    keep = ~equal.cpu()[order] if drop_zero_std_groups else torch.ones(len(scores), dtype=torch.bool)
    metrics = {
        "dgpo/groups": float(len(sizes)),
        "dgpo/groups_with_preference": float(len(set(group_of[~equal.cpu()].tolist()))),
    }
    return UpdateRows(order, keep, {NOISE_GROUP_KEY: group_of[order], GROUP_SIZE_KEY: sizes[group_of[order]]}, metrics)


def check_whole_groups(micro_batch) -> torch.Tensor:
    """The micro-batch's group ids ``[b]``, when each group in it is whole (as many rows as its ``group_size``);
    raises naming the settings that keep a group together otherwise."""
    groups = micro_batch[NOISE_GROUP_KEY].reshape(-1)
    inverse, counts = group_rows(groups)
    expected = micro_batch[GROUP_SIZE_KEY].reshape(-1).to(counts)
    if not bool((counts[inverse] == expected).all()):
        raise ValueError(
            f"a micro-batch holds part of a prompt group (groups {groups.tolist()}, group sizes {expected.tolist()}): "
            "algorithm=dgpo needs actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu to be a multiple of "
            "actor_rollout_ref.rollout.n, actor_rollout_ref.actor.shuffle=false, and its update batch as the trainer "
            "lays it out (arrange_update)"
        )
    return groups


class DGPOLoss(AlgorithmLoss):
    """:func:`~verl_omni.algorithms.dgpo_math.group_preference_loss` of one forward-noised step (``ODESamplesReplay``
    with the reference velocity), plus ``kl_coef`` times the velocity penalty; reads the advantages and the group
    layout."""

    metric_reductions = {
        "dgpo_loss": "mean",
        "dgpo_accuracy": "mean",
        "dgpo_margin": "mean",
        "group_weight_mean": "mean",
        "positive_improvement": "mean",
        "negative_improvement": "mean",
        "velocity_kl": "mean",
    }

    @property
    def required_keys(self) -> tuple[str, ...]:
        return ("advantages", NOISE_GROUP_KEY, GROUP_SIZE_KEY)

    def replay_steps(self, num_steps: int) -> Sequence[int]:
        config = self.algorithm_config
        return stratified_steps(num_steps, config.timestep_fraction, config.num_train_steps)

    def __call__(self, replayed, micro_batch, step: int) -> tuple[torch.Tensor, dict[str, float]]:
        self.check_batch(micro_batch)
        if replayed.reference_velocity is None:
            raise RuntimeError(
                "DGPO's loss needs the reference velocity at the trained noise: the engine's reference_in_update "
                "must be set (Phases.reference_in_update, before the first update)"
            )
        groups = check_whole_groups(micro_batch).to(replayed.velocity.device)
        sigma = replayed.sigma.view(-1, *([1] * (replayed.clean.ndim - 1)))
        # u = ε − x_0, recovered from x_σ = (1 − σ)·x_0 + σ·ε (σ > 0 at every trained schedule step)
        target = (replayed.noisy - replayed.clean) / sigma
        reference = replayed.reference_velocity.detach()
        loss, metrics = group_preference_loss(
            velocity_matching_error(replayed.velocity, target),
            velocity_matching_error(reference, target),
            micro_batch["advantages"].reshape(-1).to(replayed.velocity),
            groups,
            self.algorithm_config.beta,
        )
        kl_coef = self.algorithm_config.kl_coef
        velocity = replayed.velocity if kl_coef > 0 else replayed.velocity.detach()
        kl = velocity_matching_error(velocity, reference).mean()
        metrics["velocity_kl"] = kl.item()
        return (loss + kl_coef * kl if kl_coef > 0 else loss), metrics


@register_algorithm("dgpo")
class DGPO(Algorithm):
    """Direct Group Preference Optimization: ODE rollouts, each prompt group's positive sub-group preferred to its
    negative one against the frozen reference (``algorithm=dgpo``)."""

    title = "DGPO"
    config_cls = DGPOConfig
    loss_cls = DGPOLoss
    rollout_record = ODE_SAMPLES
    uses_log_probs = False
    old_outputs = ()
    reference_in_update = True

    @classmethod
    def compute_advantage(cls, scores: torch.Tensor, index: Sequence, config: DGPOConfig) -> torch.Tensor:
        """Group-normalized rewards (the authors' per-prompt stat tracker), clipped to ±adv_clip_max."""
        return compute_flow_grpo_advantage(
            scores, index, global_std=config.global_std, epsilon=config.epsilon, adv_clip_max=config.adv_clip_max
        )

    @classmethod
    def arrange_update(cls, scores: torch.Tensor, index: Sequence, config: DGPOConfig) -> UpdateRows:
        """Each prompt group's rows together, one group after another."""
        return arrange_groups(scores.detach().flatten().cpu(), index, config.drop_zero_std_groups)

    @classmethod
    def check(cls, configs) -> None:
        """ODE rollouts, no separate KL phase, each prompt group kept whole in one micro-batch."""
        name = configs.algorithm.name
        if configs.rollout.noise_level != 0:
            raise ValueError(
                f"algorithm={name} trains on ODE samples: set actor_rollout_ref.rollout.noise_level=0 "
                f"(got {configs.rollout.noise_level})"
            )
        if configs.actor.kl_beta != 0:
            raise ValueError(
                f"algorithm={name}: actor_rollout_ref.actor.kl_beta must be 0 (the loss holds the policy to the "
                "reference through algorithm.beta; its velocity penalty is algorithm.kl_coef)"
            )
        micro, n = configs.actor.ppo_micro_batch_size_per_gpu, configs.rollout.n
        if micro % n:
            raise ValueError(
                f"algorithm={name} trains a prompt group's samples in one forward: "
                f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro} must be a multiple of "
                f"actor_rollout_ref.rollout.n={n}"
            )
        if configs.actor.shuffle:
            raise ValueError(
                f"algorithm={name} lays each prompt group out in adjacent rows: set actor_rollout_ref.actor.shuffle="
                "false (shuffled mini-batches would split the groups)"
            )

"""Advantage Weighted Matching (Xue et al., 2025, arXiv:2509.25050): the pretraining loss, weighted by the advantage.

The rollout samples clean images with the ODE (the ``ode_samples`` record: clean latents plus conditioning, no
log-probs). The trainer noises each clean sample forward at a schedule step, x_σ = (1 − σ)·x_0 + σ·ε, and trains
the velocity with the flow-matching loss of pretraining, each sample weighted by its group advantage:

    L(θ) = E_{i, σ, ε} [ Â_i · w(σ) · mean‖v_θ(x_σ, σ) − (ε − x_0)‖² ],    Â_i = clip(A_i, ±c) / c,

so high-reward samples are pulled toward and low-reward ones pushed away from the model's flow. The authors'
code (``advantage_weighted_matching/scripts/train_sd3_awm.py``, ``compute_log_prob_awm`` and its training loop)
writes the same objective as a PPO ratio of ``exp(−matching loss)`` between the trained and the sampling policy;
on the first optimizer step of an update the ratio is 1 and its gradient is the gradient of L above, which is
what this module trains (every update is one optimizer step per mini-batch, on-policy). Their weightings
w(σ): uniform, σ, σ², and the generalized Huber ``((m + δ)^p − δ^p)·σ/p`` of the per-sample mean squared error m.
Formulas: ``docs/design.md``, "Advantage Weighted Matching".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from verl_omni.algorithms.base import Algorithm, AlgorithmConfig, AlgorithmLoss, register_algorithm
from verl_omni.algorithms.flow_grpo_math import compute_flow_grpo_advantage
from verl_omni.pipelines.model_base import ODE_SAMPLES

# how the per-sample matching error is weighted by the noise level σ (the authors' ``train.weighting``)
WEIGHTINGS = ("uniform", "sigma", "sigma_squared", "ghuber")
# δ of the generalized Huber weighting: keeps its gradient finite at a zero error (the authors' constant)
GHUBER_DELTA = 1e-10


@dataclass
class AWMConfig(AlgorithmConfig):
    """Advantage Weighted Matching (``algorithm=awm``).

    Args:
        name (str): ``awm``.
        global_std (bool): normalize rewards by the std over the whole batch (True, the authors' recipes) or per
            prompt group.
        epsilon (float): added to the std.
        adv_clip_max (float): advantages are clipped to ±adv_clip_max and divided by it, so each sample's weight
            lies in [−1, 1] (the authors' ``advantage_max`` 1).
        timestep_fraction (float): the trained schedule steps are drawn from the first ``timestep_fraction`` of
            the T steps (the noisiest end), in (0, 1].
        num_train_steps (int): schedule steps trained on per mini-batch, one drawn from each of that many equal
            strata of the allowed steps (at most their number), >= 1.
        weighting (str): w(σ) of the matching error: ``uniform`` (1), ``sigma`` (σ), ``sigma_squared`` (σ²) or
            ``ghuber`` (the generalized Huber ((m + δ)^p − δ^p)·σ/p of the per-sample error m).
        ghuber_power (float): p of the ``ghuber`` weighting, in (0, 1].
    """

    name: str = "awm"
    global_std: bool = True
    epsilon: float = 1e-4
    adv_clip_max: float = 5.0
    timestep_fraction: float = 0.9
    num_train_steps: int = 6
    weighting: str = "uniform"
    ghuber_power: float = 0.25

    def __post_init__(self):
        super().__post_init__()
        self.require_positive("epsilon", "adv_clip_max")
        self.require_fraction("timestep_fraction")
        if not (isinstance(self.num_train_steps, int) and self.num_train_steps >= 1):
            raise ValueError(f"algorithm.num_train_steps must be an integer >= 1, got {self.num_train_steps!r}")
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"algorithm.weighting must be one of {WEIGHTINGS}, got {self.weighting!r}")
        if not 0 < self.ghuber_power <= 1:
            raise ValueError(f"algorithm.ghuber_power must be in (0, 1], got {self.ghuber_power}")


def matching_error(velocity: torch.Tensor, noisy: torch.Tensor, clean: torch.Tensor, sigma: torch.Tensor):
    """Per sample mean((v_θ − (ε − x_0))²), the flow-matching error; ε − x_0 = (x_σ − x_0)/σ for x_σ of σ > 0."""
    s = sigma.view(-1, *([1] * (clean.ndim - 1)))
    target = (noisy - clean) / s
    return ((velocity - target) ** 2).mean(dim=tuple(range(1, clean.ndim)))


def weighted_matching_loss(error: torch.Tensor, sigma: torch.Tensor, weighting: str, ghuber_power: float):
    """w(σ) applied to the per-sample matching error ``error`` ``[B]`` (see :data:`WEIGHTINGS`)."""
    if weighting == "uniform":
        return error
    if weighting == "sigma":
        return error * sigma
    if weighting == "sigma_squared":
        return error * sigma**2
    if weighting == "ghuber":
        p = ghuber_power
        return ((error + GHUBER_DELTA) ** p - GHUBER_DELTA**p) * sigma / p
    raise ValueError(f"algorithm.weighting must be one of {WEIGHTINGS}, got {weighting!r}")


def awm_policy_loss(
    velocity: torch.Tensor,
    noisy: torch.Tensor,
    clean: torch.Tensor,
    sigma: torch.Tensor,
    advantages: torch.Tensor,
    config: AWMConfig,
) -> tuple[torch.Tensor, dict[str, float]]:
    """AWM's loss of one forward-noised step: mean over samples of Â·w(σ)·(matching error).

    Args:
        velocity (`torch.Tensor`, ``[B, ...]``): v_θ at x_σ (with gradients).
        noisy, clean (`torch.Tensor`, ``[B, ...]``): x_σ and x_0.
        sigma (`torch.Tensor`, ``[B]``): σ of x_σ (> 0).
        advantages (`torch.Tensor`, ``[B]``): group advantages A (clipped and scaled here: Â = clip(A, ±c)/c).
        config (`AWMConfig`): the weighting and the clip c.

    Returns:
        the loss and its float metrics.
    """
    error = matching_error(velocity, noisy, clean, sigma)
    weighted = weighted_matching_loss(error, sigma, config.weighting, config.ghuber_power)
    c = config.adv_clip_max
    weight = advantages.clamp(-c, c) / c
    loss = (weight * weighted).mean()
    metrics = {
        "policy_loss": loss.item(),
        "matching_loss": error.detach().mean().item(),
        "weighted_matching_loss": weighted.detach().mean().item(),
        "advantage_weight_abs_mean": weight.abs().mean().item(),
    }
    return loss, metrics


def stratified_steps(num_steps: int, fraction: float, count: int) -> list[int]:
    """One random step from each of ``count`` equal strata of the first ``fraction`` of ``num_steps`` schedule steps
    (fewer strata when fewer steps are allowed): the trained noise levels cover the range at every update."""
    limit = max(1, int(num_steps * fraction))
    count = min(count, limit)
    bounds = torch.linspace(0, limit, count + 1).long()
    lower, upper = bounds[:-1], bounds[1:]
    return (lower + (torch.rand(count) * (upper - lower)).long()).tolist()


class AWMLoss(AlgorithmLoss):
    """:func:`awm_policy_loss` of one forward-noised step (``ODESamplesReplay``); reads ``advantages`` ``[b]``."""

    metric_reductions = {
        "policy_loss": "mean",
        "matching_loss": "mean",
        "weighted_matching_loss": "mean",
        "advantage_weight_abs_mean": "mean",
    }

    @property
    def required_keys(self) -> tuple[str, ...]:
        return ("advantages",)

    def replay_steps(self, num_steps: int) -> Sequence[int]:
        config = self.algorithm_config
        return stratified_steps(num_steps, config.timestep_fraction, config.num_train_steps)

    def __call__(self, replayed, micro_batch, step: int) -> tuple[torch.Tensor, dict[str, float]]:
        self.check_batch(micro_batch)
        advantages = micro_batch["advantages"].to(replayed.velocity)
        return awm_policy_loss(
            replayed.velocity, replayed.noisy, replayed.clean, replayed.sigma, advantages, self.algorithm_config
        )


@register_algorithm("awm")
class AWM(Algorithm):
    """Advantage Weighted Matching: ODE rollouts, the advantage-weighted flow-matching loss (``algorithm=awm``)."""

    title = "AWM"
    config_cls = AWMConfig
    loss_cls = AWMLoss
    rollout_record = ODE_SAMPLES
    uses_log_probs = False
    old_outputs = ()

    @classmethod
    def compute_advantage(cls, scores: torch.Tensor, index: Sequence, config: AWMConfig) -> torch.Tensor:
        """Group-normalized rewards (the authors' per-prompt stat tracker), clipped to ±adv_clip_max."""
        return compute_flow_grpo_advantage(
            scores, index, global_std=config.global_std, epsilon=config.epsilon, adv_clip_max=config.adv_clip_max
        )

    @classmethod
    def check(cls, configs) -> None:
        """ODE rollouts (noise level 0); no KL term (the reference would see another ε than the trained step)."""
        rollout = configs.rollout
        if rollout.noise_level != 0:
            raise ValueError(
                f"algorithm=awm trains on ODE samples: set actor_rollout_ref.rollout.noise_level=0 "
                f"(got {rollout.noise_level})"
            )
        if configs.actor.kl_beta != 0:
            raise ValueError(
                "algorithm=awm: actor_rollout_ref.actor.kl_beta must be 0 (its KL term to the reference on "
                "forward-noised samples is not implemented)"
            )

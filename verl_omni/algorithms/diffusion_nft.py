"""DiffusionNFT (Zheng et al., 2025, arXiv:2509.16117): online RL on the forward process, no log-probs, no CFG.

The rollout samples clean images with the ODE (any deterministic sampler; the ``ode_samples`` record:
clean latents plus conditioning). The trainer noises each clean sample forward, x_σ = (1 − σ)·x_0 + σ·ε,
and trains the velocity with a flow-matching loss on two implicit policies built from the trained
velocity v_θ and the old policy's v_old,

    v⁺ = (1 − β)·v_old + β·v_θ        v⁻ = (1 + β)·v_old − β·v_θ,

weighted by the optimality probability r ∈ [0, 1] of each sample (its group-normalized reward, clipped
and mapped to [0, 1]): r·‖v⁺ − v‖² + (1 − r)·‖v⁻ − v‖² (paper eq. 8; the authors' code measures both terms on
the implied x_0 with an adaptive per-sample weight, which is what :func:`nft_policy_loss` computes). The old
policy is an EMA of the trained LoRA kept as a second adapter on the same base (``Phases.old_policy_adapter``).
Formulas, sections and equation numbers: ``docs/design.md``, "DiffusionNFT".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from verl_omni.algorithms.base import (
    Algorithm,
    AlgorithmConfig,
    AlgorithmLoss,
    register_algorithm,
)
from verl_omni.algorithms.flow_grpo_math import compute_flow_grpo_advantage
from verl_omni.pipelines.model_base import ODE_SAMPLES

# the adaptive weight's floor (the authors' code), so a perfect x_0 prediction does not divide by zero
ADAPTIVE_WEIGHT_MIN = 1e-5


@dataclass
class DiffusionNFTConfig(AlgorithmConfig):
    """DiffusionNFT (``algorithm=diffusion_nft``); defaults are the authors' SD3.5 recipe.

    Args:
        name (str): ``diffusion_nft``.
        beta (float): β, the strength of the implicit guidance (how far v⁺ and v⁻ move from v_old), > 0.
        global_std (bool): normalize rewards by the std over the whole batch (True) or per prompt group.
        epsilon (float): added to the std.
        adv_clip_max (float): normalized rewards are clipped to ±adv_clip_max, then mapped to r ∈ [0, 1];
            the loss is scaled by it (as in the authors' code).
        timestep_fraction (float): fraction of the T schedule steps each update trains on (at least one).
        decay_flat_steps (int): optimizer steps during which the old policy follows the trained one (η = 0).
        decay_rate (float): η grows by this per optimizer step after the flat steps ...
        decay_max (float): ... up to this (η = min(decay_rate·(steps − decay_flat_steps), decay_max)).
    """

    name: str = "diffusion_nft"
    beta: float = 1.0
    global_std: bool = True
    epsilon: float = 1e-4
    adv_clip_max: float = 5.0
    timestep_fraction: float = 0.99
    decay_flat_steps: int = 0
    decay_rate: float = 0.001
    decay_max: float = 0.5

    def __post_init__(self):
        super().__post_init__()
        self.require_positive("beta", "epsilon", "adv_clip_max")
        self.require_fraction("timestep_fraction")
        if self.decay_flat_steps < 0 or self.decay_rate < 0:
            raise ValueError("algorithm.decay_flat_steps and algorithm.decay_rate must be >= 0")
        if not 0 <= self.decay_max <= 1:
            raise ValueError(f"algorithm.decay_max must be in [0, 1], got {self.decay_max}")


def optimality_probability(advantages: torch.Tensor, adv_clip_max: float) -> torch.Tensor:
    """r = clip(A, ±c)/(2c) + 1/2 ∈ [0, 1]: a normalized reward as the probability that a sample is optimal."""
    return (advantages.clamp(-adv_clip_max, adv_clip_max) / adv_clip_max / 2 + 0.5).clamp(0.0, 1.0)


def _weighted_x0_error(x0_pred: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
    """Per sample mean((x̂_0 − x_0)²) / mean|x̂_0 − x_0| (the weight detached, floored): the adaptive loss weight."""
    dims = tuple(range(1, x0.ndim))
    with torch.no_grad():
        weight = (x0_pred.double() - x0.double()).abs().mean(dim=dims, keepdim=True).clamp(min=ADAPTIVE_WEIGHT_MIN)
    return ((x0_pred - x0) ** 2 / weight.to(x0_pred.dtype)).mean(dim=dims)


def nft_policy_loss(
    velocity: torch.Tensor,
    old_velocity: torch.Tensor,
    noisy: torch.Tensor,
    clean: torch.Tensor,
    sigma: torch.Tensor,
    r: torch.Tensor,
    beta: float,
    scale: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DiffusionNFT's loss of one forward-noised step.

    Args:
        velocity, old_velocity (`torch.Tensor`, ``[B, ...]``): v_θ (with gradients) and v_old at x_σ.
        noisy, clean (`torch.Tensor`, ``[B, ...]``): x_σ and x_0.
        sigma (`torch.Tensor`, ``[B]``): σ of x_σ.
        r (`torch.Tensor`, ``[B]``): optimality probabilities (:func:`optimality_probability`).
        beta (float): β of the implicit policies.
        scale (float): the loss multiplier (``adv_clip_max`` in the authors' code).

    Returns:
        the loss (mean over samples of scale·[r·L⁺ + (1 − r)·L⁻]/β) and its float metrics.
    """
    old = old_velocity.detach()
    s = sigma.view(-1, *([1] * (clean.ndim - 1)))
    positive = beta * velocity + (1 - beta) * old
    negative = (1 + beta) * old - beta * velocity
    # x_σ = x_0 + σ·v for v = ε − x_0: each policy's velocity implies x̂_0 = x_σ − σ·v
    positive_loss = _weighted_x0_error(noisy - s * positive, clean)
    negative_loss = _weighted_x0_error(noisy - s * negative, clean)
    per_sample = (r * positive_loss + (1 - r) * negative_loss) / beta
    loss = (per_sample * scale).mean()
    deviation = (velocity.detach() - old) ** 2
    metrics = {
        "policy_loss": loss.item(),
        "positive_loss": positive_loss.mean().item(),
        "negative_loss": negative_loss.mean().item(),
        "old_deviate": deviation.mean().item(),
        "old_deviate_max": deviation.max().item(),
        "optimality_mean": r.mean().item(),
    }
    return loss, metrics


class DiffusionNFTLoss(AlgorithmLoss):
    """:func:`nft_policy_loss` of one forward-noised step (``ODESamplesReplay``); reads ``advantages`` ``[b]``."""

    metric_reductions = {
        "policy_loss": "mean",
        "positive_loss": "mean",
        "negative_loss": "mean",
        "old_deviate": "mean",
        "old_deviate_max": "max",
        "optimality_mean": "mean",
    }

    @property
    def required_keys(self) -> tuple[str, ...]:
        return ("advantages",)

    def replay_steps(self, num_steps: int) -> Sequence[int]:
        """A random ``timestep_fraction`` of the T schedule steps (at least one), drawn per mini-batch."""
        count = max(1, int(num_steps * self.algorithm_config.timestep_fraction))
        return sorted(torch.randperm(num_steps)[:count].tolist())

    def __call__(self, replayed, micro_batch, step: int) -> tuple[torch.Tensor, dict[str, float]]:
        self.check_batch(micro_batch)
        if replayed.old_velocity is None:
            raise RuntimeError(
                "DiffusionNFT's loss needs the old policy's velocity: the actor's module has no old-policy adapter "
                "(Phases.old_policy_adapter must reach the engine before it is initialized)"
            )
        config = self.algorithm_config
        r = optimality_probability(micro_batch["advantages"].to(replayed.velocity), config.adv_clip_max)
        return nft_policy_loss(
            replayed.velocity,
            replayed.old_velocity,
            replayed.noisy,
            replayed.clean,
            replayed.sigma,
            r,
            config.beta,
            config.adv_clip_max,
        )


@register_algorithm("diffusion_nft")
class DiffusionNFT(Algorithm):
    """DiffusionNFT: ODE rollouts, forward-process loss, old policy as an EMA adapter (``algorithm=diffusion_nft``)."""

    title = "DiffusionNFT"
    config_cls = DiffusionNFTConfig
    loss_cls = DiffusionNFTLoss
    rollout_record = ODE_SAMPLES
    uses_log_probs = False
    old_outputs = ()
    old_policy_adapter = True

    @classmethod
    def compute_advantage(cls, scores: torch.Tensor, index: Sequence, config: DiffusionNFTConfig) -> torch.Tensor:
        """Group-normalized rewards (the authors' per-prompt stat tracker), clipped to ±adv_clip_max."""
        return compute_flow_grpo_advantage(
            scores, index, global_std=config.global_std, epsilon=config.epsilon, adv_clip_max=config.adv_clip_max
        )

    @classmethod
    def old_policy_decay(cls, config: DiffusionNFTConfig, optimizer_steps: int) -> float:
        if optimizer_steps < config.decay_flat_steps:
            return 0.0
        return min(config.decay_rate * (optimizer_steps - config.decay_flat_steps), config.decay_max)

    @classmethod
    def check(cls, configs) -> None:
        """ODE rollouts (noise level 0) without CFG, a LoRA for the old adapter, no KL term (not implemented)."""
        rollout = configs.rollout
        if rollout.noise_level != 0:
            raise ValueError(
                f"algorithm=diffusion_nft trains on ODE samples: set actor_rollout_ref.rollout.noise_level=0 "
                f"(got {rollout.noise_level})"
            )
        if rollout.sampling_spec(adapter=configs.model.adapter).uses_cfg:
            raise ValueError(
                "algorithm=diffusion_nft is CFG-free: set actor_rollout_ref.rollout.true_cfg_scale=1.0 "
                "(the resolved scale is > 1)"
            )
        if configs.model.lora.rank <= 0:
            raise ValueError(
                "algorithm=diffusion_nft keeps its old policy as a second LoRA adapter: "
                "set actor_rollout_ref.model.lora.rank > 0"
            )
        if configs.actor.kl_beta != 0:
            raise ValueError(
                "algorithm=diffusion_nft: actor_rollout_ref.actor.kl_beta must be 0 (its KL term to the reference "
                "on forward-noised samples is not implemented)"
            )

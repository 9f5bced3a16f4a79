"""GRPO-Guard (Wang et al., 2025, arXiv:2510.22319) on Flow-GRPO's ``sde`` sampler.

Flow-GRPO's clipped ratio, with two changes of the loss (``docs/design.md``, "GRPO-Guard"):

* **ratio normalization** (RatioNorm): at one SDE step the log-ratio log π_θ − log π_old of a
  transition drawn from π_old has mean −‖μ_θ − μ_old‖²/(2σ²) (σ = s·√−Δt, the step's std), so
  the ratio sits left of 1 and the clip rarely catches over-confident positive updates; its spread
  also scales with 1/σ, different at every step. Adding the shift back and multiplying by σ gives
  a ratio centred on 1 with a spread that no longer depends on the step's noise;
* **gradient reweighting**: the normalized ratio's gradient is proportional to the step size −Δt,
  so each step's policy loss is divided by −Δt and every noise level weighs the same.

The advantage, rollout (an SDE window with log-probs) and the KL term are Flow-GRPO's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from verl_omni.algorithms.base import register_algorithm
from verl_omni.algorithms.flow_grpo import FlowGRPO, FlowGRPOAlgoConfig, FlowGRPOLoss

# how the RatioNorm shift is reduced: per sample (the derivation's conditional mean) or over the micro-batch
RATIO_NORM_REDUCTIONS = ("sample", "batch")


@dataclass
class GRPOGuardConfig(FlowGRPOAlgoConfig):
    """Flow-GRPO's group advantage plus GRPO-Guard's switches (``algorithm=grpo_guard``).

    Args:
        name (str): ``grpo_guard``.
        ratio_norm (bool): RatioNorm: ρ = exp((log π_θ − log π_old + ‖μ_θ − μ_old‖²/(2σ²))·σ), σ = s·√−Δt.
        grad_reweight (bool): divide each replayed step's policy loss by its −Δt.
        ratio_norm_reduce (str): over what the RatioNorm shift is averaged. ``sample`` (default): each sample's
            own ‖μ_θ − μ_old‖²/(2σ²), the conditional mean of its log-ratio, so each sample's ratio is centred
            on 1. ``batch``: the mean of those shifts over the micro-batch, added to every sample, as the
            authors' training script computes it; their per-sample ratios are then off 1 by their deviation
            from that mean.
    """

    name: str = "grpo_guard"
    ratio_norm: bool = True
    grad_reweight: bool = True
    ratio_norm_reduce: str = "sample"

    def __post_init__(self):
        super().__post_init__()
        if self.ratio_norm_reduce not in RATIO_NORM_REDUCTIONS:
            raise ValueError(
                f"algorithm.ratio_norm_reduce must be one of {RATIO_NORM_REDUCTIONS}, got {self.ratio_norm_reduce!r}"
            )


def compute_grpo_guard_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    prev_sample_mean: torch.Tensor,
    old_prev_sample_mean: torch.Tensor,
    std_dev_t: torch.Tensor,
    dt: torch.Tensor,
    clip_ratio: float,
    ratio_norm: bool = True,
    grad_reweight: bool = True,
    ratio_norm_reduce: str = "sample",
) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO-Guard's clipped policy loss of one replayed SDE step (without the KL term).

    Args:
        log_prob (`torch.Tensor`, ``[B]``): log π_θ of the recorded transition (mean over latent dims, with grad).
        old_log_prob (`torch.Tensor`, ``[B]``): log π_old of the same transition.
        advantages (`torch.Tensor`, ``[B]``): per-sample advantages.
        prev_sample_mean (`torch.Tensor`, ``[B, ...]``): μ_θ (with grad).
        old_prev_sample_mean (`torch.Tensor`, ``[B, ...]``): μ_old.
        std_dev_t (`torch.Tensor`, ``[B, 1, ...]`` or ``[B]``): s of the ``sde`` kernel.
        dt (`torch.Tensor`, ``[B]``): σ' − σ of each sample's step (< 0).
        clip_ratio: ε of the clip, applied to the (normalized) ratio.
        ratio_norm, grad_reweight: the two parts of GRPO-Guard (both off: Flow-GRPO's policy loss).
        ratio_norm_reduce: ``sample`` or ``batch``, see :class:`GRPOGuardConfig`.

    Returns:
        ``(loss, metrics)``: ``pg_loss`` (the reweighted loss), ``pg_clipfrac``, ``ppo_kl``, ``ratio_mean`` and
        ``ratio_max_abs_dev`` of the ratio the clip sees, ``raw_ratio_mean`` (exp(log π_θ − log π_old)),
        ``ratio_mean_bias`` (the shift added back) and ``step_weight_mean`` (mean 1/(−Δt), 1 when off).
    """
    batch = log_prob.shape[0]
    for name, t in (("old_log_prob", old_log_prob), ("advantages", advantages), ("dt", dt)):
        if t.shape != log_prob.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(log_prob.shape)} like log_prob")
    if prev_sample_mean.shape != old_prev_sample_mean.shape or prev_sample_mean.shape[0] != batch:
        raise ValueError(
            f"prev_sample_mean {tuple(prev_sample_mean.shape)} and old_prev_sample_mean "
            f"{tuple(old_prev_sample_mean.shape)} must both be [B, ...] with B={batch}"
        )
    if not bool((dt < 0).all()):
        raise ValueError(f"dt must be < 0 (a denoising step lowers sigma), got {dt.tolist()}")
    if not clip_ratio > 0:
        raise ValueError(f"clip_ratio must be > 0, got {clip_ratio}")
    if ratio_norm_reduce not in RATIO_NORM_REDUCTIONS:
        raise ValueError(f"ratio_norm_reduce must be one of {RATIO_NORM_REDUCTIONS}, got {ratio_norm_reduce!r}")

    s = std_dev_t.detach().reshape(batch, -1)[:, 0].to(log_prob)
    step_std = s * torch.sqrt(-dt.to(log_prob))
    log_ratio = log_prob - old_log_prob.detach()
    diff = (prev_sample_mean - old_prev_sample_mean.detach()).reshape(batch, -1)
    bias = (diff**2).mean(dim=1) / (2 * step_std**2)
    if ratio_norm_reduce == "batch":
        bias = bias.mean().expand_as(bias)
    ratio = torch.exp((log_ratio + bias) * step_std) if ratio_norm else torch.exp(log_ratio)
    adv = advantages.detach().to(ratio.dtype)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_ratio, 1.0 + clip_ratio)
    per_sample = torch.maximum(unclipped, clipped)
    weight = 1.0 / (-dt.to(ratio)) if grad_reweight else torch.ones_like(ratio)
    pg_loss = (per_sample * weight).mean()

    with torch.no_grad():
        metrics = {
            "pg_loss": pg_loss.item(),
            "pg_clipfrac": (clipped > unclipped).float().mean().item(),
            "ppo_kl": (-log_ratio).mean().item(),
            "ratio_mean": ratio.mean().item(),
            "ratio_max_abs_dev": (ratio - 1).abs().max().item(),
            "raw_ratio_mean": torch.exp(log_ratio).mean().item(),
            "ratio_mean_bias": bias.mean().item(),
            "step_weight_mean": weight.mean().item(),
        }
    return pg_loss, metrics


class GRPOGuardLoss(FlowGRPOLoss):
    """GRPO-Guard's loss of one replayed step (+ Flow-GRPO's β·KL to the reference).

    Reads ``old_log_probs`` and ``old_prev_sample_mean`` ``[b, W, N, C]`` (the ``old_log_prob`` phase keeps
    both), ``advantages`` and, when ``actor.kl_beta > 0``, ``ref_prev_sample_mean``.
    """

    metric_reductions = {
        **FlowGRPOLoss.metric_reductions,
        "raw_ratio_mean": "mean",
        "ratio_mean_bias": "mean",
        "step_weight_mean": "mean",
    }

    @property
    def required_keys(self) -> tuple[str, ...]:
        ref = ("ref_prev_sample_mean",) if self.actor_config.kl_beta > 0 else ()
        return ("old_log_probs", "old_prev_sample_mean", "advantages") + ref

    def __call__(self, replayed, micro_batch, step: int) -> tuple[torch.Tensor, dict[str, float]]:
        self.check_batch(micro_batch)
        actor, config = self.actor_config, self.algorithm_config
        old = micro_batch["old_log_probs"][:, step].to(replayed.log_prob)
        pg_loss, metrics = compute_grpo_guard_policy_loss(
            replayed.log_prob,
            old,
            micro_batch["advantages"].to(replayed.log_prob),
            replayed.prev_sample_mean,
            micro_batch["old_prev_sample_mean"][:, step].to(replayed.prev_sample_mean),
            replayed.std_dev_t,
            replayed.dt,
            clip_ratio=actor.clip_ratio,
            ratio_norm=config.ratio_norm,
            grad_reweight=config.grad_reweight,
            ratio_norm_reduce=config.ratio_norm_reduce,
        )
        kl_loss = torch.zeros_like(pg_loss)
        if actor.kl_beta > 0:
            kl_loss = flow_grpo_kl(replayed, micro_batch["ref_prev_sample_mean"][:, step])
        metrics["kl_loss"] = kl_loss.item()
        metrics["logprob_diff_max"] = (replayed.log_prob.detach() - old).abs().max().item()
        return pg_loss + actor.kl_beta * kl_loss, metrics


def flow_grpo_kl(replayed, ref_prev_sample_mean: torch.Tensor) -> torch.Tensor:
    """Flow-GRPO's KL to the reference, mean over samples of mean((μ_θ − μ_ref)²) / (2s²)."""
    batch = replayed.log_prob.shape[0]
    mu = replayed.prev_sample_mean.reshape(batch, -1)
    mu_ref = ref_prev_sample_mean.detach().to(mu).reshape(batch, -1)
    s = replayed.std_dev_t.detach().reshape(batch, -1)[:, 0]
    return (((mu - mu_ref) ** 2).mean(dim=1) / (2 * s**2)).mean()


@register_algorithm("grpo_guard")
class GRPOGuard(FlowGRPO):
    """GRPO-Guard: Flow-GRPO's sampler and advantage, the regulated clipped loss."""

    title = "GRPO-Guard"
    config_cls = GRPOGuardConfig
    loss_cls = GRPOGuardLoss
    # RatioNorm needs μ_old, which the rollout does not record: the actor recomputes the old policy's replay
    old_outputs = ("log_probs", "prev_sample_mean")
    needs_old_log_prob_recompute = True

    @classmethod
    def check(cls, configs) -> None:
        """The normalization is derived for the ``sde`` kernel (std s·√−Δt); log π_old and μ_old come from one replay."""
        if configs.rollout.sde_type != "sde":
            raise ValueError(
                f"algorithm=grpo_guard needs actor_rollout_ref.rollout.sde_type=sde (its ratio normalization uses "
                f"the sde kernel's step std s*sqrt(-dt)), got {configs.rollout.sde_type!r}"
            )
        if configs.actor.use_rollout_log_probs:
            raise ValueError(
                "algorithm=grpo_guard needs actor_rollout_ref.actor.use_rollout_log_probs=false: its ratio "
                "normalization reads the old policy's means, which the actor recomputes with log pi_old"
            )

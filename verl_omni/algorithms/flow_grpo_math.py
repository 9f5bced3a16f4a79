"""Flow-GRPO's math: the group-normalized advantage, the clipped policy loss, and the prompt groups whose
rewards are all equal (``docs/design.md``, "Advantage and loss (Flow-GRPO)").

Plain functions of tensors, with no registry: the algorithm contract (:mod:`verl_omni.algorithms.base`) is
how the trainer and the actor find an algorithm, and each algorithm module calls the functions it uses from
here (Flow-GRPO and GRPO-Guard the loss, Flow-GRPO and DiffusionNFT the advantage, the trainer the zero-std
groups).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def _group_ids(index: Sequence, batch_size: int) -> np.ndarray:
    ids = np.asarray(index, dtype=object)
    if ids.ndim != 1 or len(ids) != batch_size:
        raise ValueError(f"index (group ids) has shape {ids.shape} but scores has {batch_size} samples")
    return ids


def zero_std_groups(scores: torch.Tensor, index: Sequence) -> tuple[torch.Tensor, float]:
    """Which samples belong to a prompt group whose rewards are all equal, and the share of such groups.

    Such a group carries no learning signal: every group-normalized advantage of it is 0 (up to the
    rounding of its mean). "All equal" is exact equality (max == min), not ``std == 0`` of a rounded
    mean; a group of one sample counts (there is nothing to compare it with).

    Args:
        scores (`torch.Tensor`, ``[B]``): one reward per sample.
        index (sequence of length B): group id of each sample (the prompt's ``uid``); groups need not be contiguous.

    Returns:
        ``(zero_std, group_frac)``: `torch.BoolTensor` ``[B]`` (True for the samples of such groups, on
        ``scores``' device) and the share of the batch's groups that are such groups.
    """
    if scores.ndim != 1:
        raise ValueError(f"scores must be 1-D [B], got shape {tuple(scores.shape)}")
    ids = _group_ids(index, len(scores))
    r = scores.detach().cpu()
    zero_std = torch.zeros(len(r), dtype=torch.bool)
    groups = dict.fromkeys(ids.tolist())
    flat = 0
    for gid in groups:
        members = torch.as_tensor(np.flatnonzero(ids == gid))
        equal = bool(r[members].max() == r[members].min())
        zero_std[members] = equal
        flat += equal
    return zero_std.to(scores.device), flat / max(len(groups), 1)


def compute_flow_grpo_advantage(
    scores: torch.Tensor,
    index: Sequence,
    global_std: bool = True,
    epsilon: float = 1e-4,
    adv_clip_max: float = 5.0,
) -> torch.Tensor:
    """Group-normalized advantage A_i = (r_i − mean of i's group) / (std + ε), clipped to ±adv_clip_max.

    Args:
        scores (`torch.Tensor`, ``[B]``): one reward per sample.
        index (sequence of length B): group id of each sample (the prompt's ``uid``).
        global_std: divide by the std over the whole batch (default) instead of each group's.
            Population std (ddof=0), as in the Flow-GRPO reference code.
        epsilon: added to the std so that zero-variance groups give 0, not NaN.
        adv_clip_max: advantages are clipped to ``[-adv_clip_max, adv_clip_max]``.

    Returns:
        `torch.Tensor` ``[B]`` (fp32). Samples alone in their group get 0: there is nothing to compare.
    """
    if scores.ndim != 1:
        raise ValueError(f"scores must be 1-D [B], got shape {tuple(scores.shape)}")
    if not bool(torch.isfinite(scores).all()):
        raise ValueError("scores contain NaN or inf; a reward scorer failed to produce a value")
    if epsilon <= 0 or adv_clip_max <= 0:
        raise ValueError(f"epsilon and adv_clip_max must be > 0, got {epsilon}, {adv_clip_max}")
    ids = _group_ids(index, len(scores))
    r = scores.detach().to(torch.float64).cpu()
    adv = torch.zeros_like(r)
    global_scale = r.std(unbiased=False) if len(r) > 1 else torch.tensor(0.0, dtype=torch.float64)
    for gid in dict.fromkeys(ids.tolist()):
        members = torch.as_tensor(np.flatnonzero(ids == gid))
        if len(members) < 2:
            continue
        group = r[members]
        scale = global_scale if global_std else group.std(unbiased=False)
        adv[members] = (group - group.mean()) / (scale + epsilon)
    return adv.clamp(-adv_clip_max, adv_clip_max).to(torch.float32).to(scores.device)


def _per_sample(x: torch.Tensor, batch_size: int, name: str) -> torch.Tensor:
    if x.shape[0] != batch_size:
        raise ValueError(f"{name} has batch size {x.shape[0]}, expected {batch_size}")
    return x.reshape(batch_size, -1)


def compute_flow_grpo_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    clip_ratio: float = 1e-4,
    kl_beta: float = 0.0,
    prev_sample_mean: torch.Tensor | None = None,
    ref_prev_sample_mean: torch.Tensor | None = None,
    std_dev_t: torch.Tensor | None = None,
    is_threshold: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped Flow-GRPO loss for one replayed step, plus β·KL to the reference (docs/design.md, "Advantage and loss
    (Flow-GRPO)").

    L = mean[max(−A·ρ, −A·clip(ρ, 1−ε, 1+ε))] + β·mean[mean((μ_θ − μ_ref)²) / (2s²)], ρ = exp(log π_θ − log π_old).

    With ``is_threshold`` = C (log π_old is the rollout's, ``actor.rollout_correction.loss_type=reinforce``) the
    policy term is instead the policy gradient with a truncated importance weight, no clip (verl's bypass-mode
    REINFORCE): mean[−A·w·ρ'] with w = min(sg(ρ), C) and ρ' = exp(log π_θ − sg(log π_θ)), whose value is mean[−A·w] and
    whose gradient is mean[−A·w·∇log π_θ].

    Args:
        log_prob (`torch.Tensor`, ``[B]``): log π_θ of the recorded transition (with grad).
        old_log_prob (`torch.Tensor`, ``[B]``): log π_old (rollout or recomputed).
        advantages (`torch.Tensor`, ``[B]``): per-sample advantages.
        clip_ratio: ε of the ratio clip (Flow-GRPO uses 1e-4 with ``sde``).
        kl_beta: β; when > 0, ``prev_sample_mean`` (μ_θ), ``ref_prev_sample_mean`` (μ_ref, LoRA
            disabled) and ``std_dev_t`` (s, ``[B, ...]``) are required.
        is_threshold: C >= 1 of the truncated importance weight; None (default): the clipped ratio.

    Returns:
        ``(loss, metrics)``: scalar loss and verl-named metrics ``pg_loss``, ``pg_clipfrac`` (the clipped ratio) or
        ``is_truncated_frac`` (the share of weights capped at C), ``ppo_kl`` (mean of log π_old − log π_θ),
        ``ratio_mean``, ``ratio_max_abs_dev``, ``kl_loss``.
    """
    batch = log_prob.shape[0]
    if log_prob.ndim != 1:
        raise ValueError(f"log_prob must be 1-D [B], got shape {tuple(log_prob.shape)}")
    if old_log_prob is None:
        raise ValueError("old_log_prob is required: compute it (old_log_prob phase) or take it from the rollout")
    for name, t in (("old_log_prob", old_log_prob), ("advantages", advantages)):
        if t.shape != log_prob.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(log_prob.shape)} like log_prob")
    if not clip_ratio > 0:
        raise ValueError(f"clip_ratio must be > 0, got {clip_ratio}")
    if kl_beta < 0:
        raise ValueError(f"kl_beta must be >= 0, got {kl_beta}")
    if is_threshold is not None and not is_threshold >= 1:
        raise ValueError(f"is_threshold must be >= 1 (a weight of 1 is on-policy), got {is_threshold}")

    ratio = torch.exp(log_prob - old_log_prob.detach())
    adv = advantages.detach().to(ratio.dtype)
    if is_threshold is None:
        unclipped = -adv * ratio
        clipped = -adv * torch.clamp(ratio, 1.0 - clip_ratio, 1.0 + clip_ratio)
        pg_loss = torch.maximum(unclipped, clipped).mean()
    else:
        weight = ratio.detach().clamp(max=is_threshold)
        pg_loss = (-adv * weight * torch.exp(log_prob - log_prob.detach())).mean()

    kl_loss = torch.zeros((), dtype=pg_loss.dtype, device=pg_loss.device)
    if kl_beta > 0:
        missing = [
            n
            for n, t in (
                ("prev_sample_mean", prev_sample_mean),
                ("ref_prev_sample_mean", ref_prev_sample_mean),
                ("std_dev_t", std_dev_t),
            )
            if t is None
        ]
        if missing:
            raise ValueError(f"kl_beta={kl_beta} > 0 needs {missing}: run the reference phase or set kl_beta=0")
        mu = _per_sample(prev_sample_mean, batch, "prev_sample_mean")
        mu_ref = _per_sample(ref_prev_sample_mean.detach(), batch, "ref_prev_sample_mean")
        s = _per_sample(std_dev_t.detach(), batch, "std_dev_t")[:, 0]
        kl_loss = (((mu - mu_ref) ** 2).mean(dim=1) / (2 * s**2)).mean()
    loss = pg_loss + kl_beta * kl_loss

    with torch.no_grad():
        metrics = {
            "pg_loss": pg_loss.item(),
            "kl_loss": kl_loss.item(),
            "ppo_kl": (old_log_prob - log_prob).mean().item(),
            "ratio_mean": ratio.mean().item(),
            "ratio_max_abs_dev": (ratio - 1).abs().max().item(),
        }
        if is_threshold is None:
            metrics["pg_clipfrac"] = (clipped > unclipped).float().mean().item()
        else:
            metrics["is_truncated_frac"] = (ratio > is_threshold).float().mean().item()
    return loss, metrics

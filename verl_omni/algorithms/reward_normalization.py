"""How several scorers' rewards become the one score per sample that an algorithm's group advantage reads.

``algorithm.reward_normalization``:

* ``sum`` (default): the reward loop's weighted mean of the raw scores (``rm_scores``), as one reward.
  A scorer with a wide range then decides most of the ranking within a group, and different
  combinations of scorer values can land on the same sum (the same advantage).
* ``gdpo``: GDPO (Liu et al., 2026, arXiv:2601.05242, "Group reward-Decoupled Normalization Policy
  Optimization"). Each scorer k is normalised within each prompt group g first,
  z_ik = (r_ik − mean_{j∈g} r_jk) / std_{j∈g} r_jk, and the normalised values are combined with the
  scorers' weights, s_i = Σ_k w_k·z_ik / Σ_k w_k over the scorers that scored sample i. The algorithm's own
  advantage then normalises s, which with a batch-wide std (Flow-GRPO's default ``global_std``) is the
  paper's second, batch-wise stage: every group of s already has mean 0, so (s − group mean)/(batch std + ε)
  is the paper's (s − batch mean)/(batch std + ε). The weighted mean instead of the paper's sum keeps a sample that an
  optional scorer left out on the same scale; the batch-wise stage removes the common factor.

A scorer whose rewards are all equal within a group gives that group 0 (nothing to compare), and a
sample alone in its group gets 0, as in the group advantage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

REWARD_NORMALIZATIONS = ("sum", "gdpo")


def group_normalized(rewards: np.ndarray, index: Sequence) -> np.ndarray:
    """z = (r − group mean) / group std (population std) per prompt group; NaN (a scorer left out) stays NaN and
    is left out of its group's mean and std; a group with fewer than two values or all equal gives 0."""
    r = np.asarray(rewards, dtype=np.float64)
    groups = np.asarray(index)
    if r.shape != (len(groups),):
        raise ValueError(f"rewards have shape {r.shape}, expected ({len(groups)},) like the group ids")
    z = np.where(np.isnan(r), np.nan, 0.0)
    for gid in dict.fromkeys(groups.tolist()):
        members = np.flatnonzero((groups == gid) & ~np.isnan(r))
        if len(members) < 2:
            continue
        values = r[members]
        std = values.std()
        if std > 0:
            z[members] = (values - values.mean()) / std
    return z


def gdpo_scores(
    per_scorer: Mapping[str, np.ndarray], weights: Mapping[str, float], index: Sequence
) -> tuple[torch.Tensor, dict[str, np.ndarray]]:
    """GDPO's combined score ``[B]`` (fp32) and each scorer's group-normalised values.

    Args:
        per_scorer: scorer label -> its rewards ``[B]`` (NaN where it left a sample out).
        weights: scorer label -> its weight (> 0), the same labels.
        index: the prompt group of each sample (its ``uid``).
    """
    if set(per_scorer) != set(weights):
        raise ValueError(f"per-scorer rewards {sorted(per_scorer)} and weights {sorted(weights)} name other scorers")
    normalized = {name: group_normalized(values, index) for name, values in per_scorer.items()}
    stacked = np.stack([normalized[name] for name in weights])
    w = np.array([float(weights[name]) for name in weights])[:, None] * ~np.isnan(stacked)
    total = w.sum(axis=0)
    if not bool((total > 0).all()):
        raise ValueError(f"samples {np.flatnonzero(total == 0).tolist()} have no scorer value to combine")
    combined = (np.nan_to_num(stacked) * w).sum(axis=0) / total
    return torch.as_tensor(combined, dtype=torch.float32), normalized


def per_scorer_advantage_metrics(normalized: Mapping[str, np.ndarray], index: Sequence) -> dict[str, float]:
    """``critic/advantages/<scorer>/abs_mean`` (how strongly it ranks the samples of a group) and
    ``critic/advantages/<scorer>/zero_std_group_frac`` (groups where it ranked nobody)."""
    groups = np.asarray(index)
    metrics = {}
    for name, z in normalized.items():
        flat = [bool(np.all(np.nan_to_num(z[groups == gid]) == 0)) for gid in dict.fromkeys(groups.tolist())]
        metrics[f"critic/advantages/{name}/abs_mean"] = float(np.nanmean(np.abs(z))) if np.any(~np.isnan(z)) else 0.0
        metrics[f"critic/advantages/{name}/zero_std_group_frac"] = sum(flat) / max(len(flat), 1)
    return metrics

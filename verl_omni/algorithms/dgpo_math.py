"""DGPO's math: the group-level preference loss of a batch of whole prompt groups.

DGPO (Luo, Hu and Tang, 2025, arXiv:2510.08425) splits each prompt group of rollouts into a positive sub-group G⁺
(advantage > 0) and a negative one G⁻ (advantage < 0) and trains the Bradley-Terry likelihood that G⁺ is preferred
to G⁻, each group's reward being a weighted sum of its samples' implicit DPO rewards:

    −log σ(R(G⁺) − R(G⁻)),    R(G) = Σ_{i∈G} w_i · r_i,    r_i = −β·(e_θ(x_i) − e_ref(x_i)),

where e(x) = mean‖v(x_σ, σ) − (ε − x)‖² is the flow-matching error of the clean sample x re-noised at σ (Diffusion-DPO's
stand-in for the log-likelihood ratio, its constants folded into β) and the weight of a sample is its advantage's
magnitude over the group size, w_i = |A_i| / G. With group-normalised advantages Σ_i A_i = 0, so both sub-groups'
weights sum to the same total and the partition function of the implicit reward cancels from the difference. Writing
Δ_i = e_θ(x_i) − e_ref(x_i), the difference is −S with

    S = β/G · Σ_{i∈group} A_i · Δ_i,        loss of a group = −log σ(−S) = softplus(S).

Its gradient is σ(S) · β/G · Σ_i A_i · ∇e_θ(x_i): the advantage-weighted flow-matching gradient of each sample
(AWM's), weighted per group by σ(S), which fades as the policy's preference for G⁺ over G⁻ grows beyond the
reference's.

Sources: the objective −log σ(R(G⁺) − R(G⁻)) as the authors' README states it, and every detail below from their
public training script (``scripts/train_sd3_dgpo.py`` of Luo-Yihong/DGPO, ``compute_group_dgpo_loss_allreduce``);
the paper's own text was not at hand, so where it may normalise differently the script is what is followed:

* the weights |A_i|/G with G the prompt group's size, not |A_i| normalised by its own sub-group's sum (that would
  rescale each group's S by a per-group factor), and A the clipped group-normalised advantage; clipping can break
  Σ A = 0 slightly, as the authors note;
* the scale of the gradient: their loss is the surrogate mean_i sg[σ(S_g)]·A_i·e_θ(x_i), whose gradient is 1/β
  times the gradient of the objective above, averaged over samples. The loss here is the objective itself, each
  sample carrying its group's softplus(S)/β, averaged over samples: the same gradient (their learning rates and
  gradient clipping carry over), and a value that is the objective over β.

Plain functions of tensors, no registry (as :mod:`verl_omni.algorithms.diffusion_dpo_math`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def group_rows(groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inverse, sizes)`` of per-row group ids ``[b]``: each row's dense group index and each group's row count."""
    _, inverse, sizes = torch.unique(groups, return_inverse=True, return_counts=True)
    return inverse, sizes


def group_preference_loss(
    policy_error: torch.Tensor,
    reference_error: torch.Tensor,
    advantages: torch.Tensor,
    groups: torch.Tensor,
    beta: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DGPO's loss of whole prompt groups from per-sample flow-matching errors.

    Args:
        policy_error (`torch.Tensor`, ``[b]``): e_θ of each sample (with gradients).
        reference_error (`torch.Tensor`, ``[b]``): e_ref of the same samples at the same noise (no gradient flows).
        advantages (`torch.Tensor`, ``[b]``): each sample's group advantage A (its sign is its sub-group).
        groups (`torch.Tensor`, ``[b]``): each sample's prompt group id; every group must be whole (all its samples
            in these rows), since its size G is counted here.
        beta (float): β > 0, the implicit reward's scale.

    Returns:
        the mean over samples of softplus(S_g)/β of each sample's group g, and float metrics: ``dgpo_loss`` (the
        mean over groups of −log σ(−S), the objective unscaled), ``dgpo_accuracy`` (share of groups with S < 0: the
        policy prefers G⁺ to G⁻ more than the reference does), ``dgpo_margin`` (mean −S), ``group_weight_mean`` (mean
        σ(S), the weight the gradient still has), ``positive_improvement`` / ``negative_improvement`` (mean
        e_ref − e_θ over the samples with A > 0 / A < 0; 0 when there is none).
    """
    if not beta > 0:
        raise ValueError(f"algorithm.beta must be > 0, got {beta}")
    shapes = {tuple(t.shape) for t in (policy_error, reference_error, advantages, groups)}
    if len(shapes) != 1 or policy_error.ndim != 1:
        raise ValueError(f"errors, advantages and groups must share one [b] shape, got {sorted(shapes)}")
    inverse, sizes = group_rows(groups.to(policy_error.device))
    delta = policy_error - reference_error.detach()
    advantages = advantages.to(delta)
    # S_g = β/G · Σ_{i∈g} A_i·Δ_i, one value per group
    sums = torch.zeros(len(sizes), dtype=delta.dtype, device=delta.device).index_add(0, inverse, advantages * delta)
    preference = beta * sums / sizes.to(delta)
    group_loss = F.softplus(preference)
    loss = (group_loss[inverse] / beta).mean()
    improvement = -delta.detach()
    positive, negative = advantages > 0, advantages < 0
    metrics = {
        "dgpo_loss": group_loss.detach().mean().item(),
        "dgpo_accuracy": (preference.detach() < 0).float().mean().item(),
        "dgpo_margin": (-preference.detach()).mean().item(),
        "group_weight_mean": torch.sigmoid(preference.detach()).mean().item(),
        "positive_improvement": improvement[positive].mean().item() if bool(positive.any()) else 0.0,
        "negative_improvement": improvement[negative].mean().item() if bool(negative.any()) else 0.0,
    }
    return loss, metrics

"""Diffusion-DPO's math on flow-matching models: the preference pairs of a prompt group and the pair loss.

Diffusion-DPO (Wallace et al., 2023, arXiv:2311.12908) trains on pairs (chosen x⁺, rejected x⁻) of the
same prompt. Both samples are noised with the same ε at the same σ, and the loss compares how much the
trained policy improves the denoising error over the frozen reference on the chosen sample against the
rejected one. On a flow-matching model the error is the velocity-matching error,

    e_θ(x) = mean‖v_θ(x_σ, σ) − (ε − x)‖²,    x_σ = (1 − σ)·x + σ·ε,

and the loss of a pair is

    −log sigmoid(−β/2 · [(e_θ(x⁺) − e_ref(x⁺)) − (e_θ(x⁻) − e_ref(x⁻))]),

the paper's eq. 14 with the constant T·ω(λ) folded into β (as the authors' ``train.py`` does). The
reference is the model without the trained LoRA (or the frozen copy under full fine-tuning).

Timesteps: the paper draws t uniformly per pair, shared by its two samples; on a flow-matching schedule
the counterpart is one step of the rollout's schedule drawn per pair, so chosen and rejected see the same
σ and ε (their errors are comparable only then).

Plain functions of tensors, with no registry (as :mod:`verl_omni.algorithms.flow_grpo_math`): the
algorithm module that trains with them calls them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from verl_omni.algorithms.flow_grpo_math import _group_ids

# how the online run pairs a prompt group's rollouts: its best against its worst sample, or every pair
# whose reward gap exceeds the margin
PAIRINGS = ("best_worst", "margin")


def check_pairing(pairing: str, reward_margin: float) -> None:
    """Raise ``ValueError`` naming the key when ``algorithm.pairing`` or ``algorithm.reward_margin`` is invalid."""
    if pairing not in PAIRINGS:
        raise ValueError(f"algorithm.pairing must be one of {PAIRINGS}, got {pairing!r}")
    if not reward_margin >= 0:
        raise ValueError(
            f"algorithm.reward_margin must be >= 0 (a pair's chosen reward exceeds its rejected one by more than "
            f"it), got {reward_margin}"
        )


def preference_pairs(scores: torch.Tensor, index: Sequence, pairing: str, reward_margin: float = 0.0) -> torch.Tensor:
    """The (chosen, rejected) sample indices ``[P, 2]`` of the batch's prompt groups.

    A pair's chosen reward exceeds its rejected one by more than ``reward_margin``, so a group whose
    rewards are all equal makes no pair (it carries no preference). ``best_worst``: at most one pair per
    group, its highest-rewarded sample against its lowest (the first of equal ones); ``margin``: every
    such pair of the group (a sample may be in several).

    Args:
        scores (`torch.Tensor`, ``[B]``): rewards.
        index (sequence of length B): group id of each sample (the prompt's ``uid``); groups need not be contiguous.
        pairing (str): one of :data:`PAIRINGS`.
        reward_margin (float): the reward gap a pair must exceed, >= 0.
    """
    check_pairing(pairing, reward_margin)
    scores = scores.detach().flatten().cpu().double()
    ids = _group_ids(index, len(scores))
    pairs: list[tuple[int, int]] = []
    for group in dict.fromkeys(ids.tolist()):
        members = [int(i) for i in (ids == group).nonzero()[0]]
        if pairing == "best_worst":
            best = max(members, key=lambda i: (scores[i].item(), -i))
            worst = min(members, key=lambda i: (scores[i].item(), i))
            candidates = [(best, worst)]
        else:
            candidates = [(i, j) for i in members for j in members if i != j]
        pairs += [(i, j) for i, j in candidates if scores[i] - scores[j] > reward_margin]
    return torch.tensor(pairs, dtype=torch.long).reshape(-1, 2)


def velocity_matching_error(velocity: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-sample mean((v − u)²) ``[B]`` of velocities ``[B, ...]`` against the flow-matching target u = ε − x_0."""
    return ((velocity - target) ** 2).mean(dim=tuple(range(1, velocity.ndim)))


def diffusion_dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    reference_chosen: torch.Tensor,
    reference_rejected: torch.Tensor,
    beta: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The Diffusion-DPO loss of P pairs from their velocity-matching errors (each ``[P]``).

    Args:
        policy_chosen, policy_rejected (`torch.Tensor`, ``[P]``): e_θ of each pair's chosen and rejected sample.
        reference_chosen, reference_rejected (`torch.Tensor`, ``[P]``): e_ref of the same (no gradient flows).
        beta (float): β, > 0: how far the policy may move from the reference for a preference.

    Returns:
        the mean over pairs of −log sigmoid(−β/2·[(e_θ⁺ − e_ref⁺) − (e_θ⁻ − e_ref⁻)]) and its float metrics:
        ``dpo_accuracy`` (share of pairs whose chosen sample the policy improves more than the rejected one),
        ``dpo_margin`` (mean of the sigmoid's argument), ``chosen_improvement`` / ``rejected_improvement``
        (mean e_ref − e_θ of each side).
    """
    if not beta > 0:
        raise ValueError(f"algorithm.beta must be > 0, got {beta}")
    shapes = {t.shape for t in (policy_chosen, policy_rejected, reference_chosen, reference_rejected)}
    if len(shapes) != 1 or policy_chosen.ndim != 1:
        raise ValueError(f"the four per-pair errors must share one [P] shape, got {sorted(map(tuple, shapes))}")
    chosen_gap = policy_chosen - reference_chosen.detach()
    rejected_gap = policy_rejected - reference_rejected.detach()
    margin = -0.5 * beta * (chosen_gap - rejected_gap)
    # −log sigmoid(z) = softplus(−z), without sigmoid's underflow at large −z
    loss = F.softplus(-margin).mean()
    metrics = {
        "dpo_loss": loss.item(),
        "dpo_accuracy": (margin.detach() > 0).float().mean().item(),
        "dpo_margin": margin.detach().mean().item(),
        "chosen_improvement": (-chosen_gap.detach()).mean().item(),
        "rejected_improvement": (-rejected_gap.detach()).mean().item(),
    }
    return loss, metrics


def diffusion_dpo_pair_loss(
    velocity: torch.Tensor,
    reference_velocity: torch.Tensor,
    target: torch.Tensor,
    pairs: torch.Tensor,
    beta: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """:func:`diffusion_dpo_loss` of the ``pairs`` ``[P, 2]`` (chosen, rejected rows) of one noised batch.

    ``velocity`` (with gradients), ``reference_velocity`` and ``target`` (u = ε − x_0) are ``[B, ...]``; the
    caller noised a pair's two rows with the same ε and σ.
    """
    if pairs.ndim != 2 or pairs.shape[1] != 2 or pairs.shape[0] == 0:
        raise ValueError(f"pairs must be a non-empty [P, 2] of (chosen, rejected) rows, got {tuple(pairs.shape)}")
    policy = velocity_matching_error(velocity, target)
    reference = velocity_matching_error(reference_velocity.detach(), target)
    chosen, rejected = pairs[:, 0], pairs[:, 1]
    return diffusion_dpo_loss(policy[chosen], policy[rejected], reference[chosen], reference[rejected], beta)

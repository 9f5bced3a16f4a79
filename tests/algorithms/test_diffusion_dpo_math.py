"""Diffusion-DPO's pair loss and pairing against an independent re-derivation on small tensors.

The reference formula is the paper's (Wallace et al., 2023, arXiv:2311.12908, eq. 14, the constant T·ω(λ)
folded into β as the authors' public ``train.py`` of SalesforceAIResearch/DiffusionDPO does), written here
per pair in float64 with plain Python arithmetic on the squared errors.
"""

import math

import pytest
import torch

from verl_omni.algorithms.diffusion_dpo_math import (
    diffusion_dpo_loss,
    diffusion_dpo_pair_loss,
    preference_pairs,
    velocity_matching_error,
)


def rederived_loss(velocity, reference_velocity, clean, noise, pairs, beta) -> float:
    """Mean over pairs of −log(1 / (1 + exp(−z))), z = −β/2·[(e_θ⁺ − e_ref⁺) − (e_θ⁻ − e_ref⁻)], e the mean
    squared velocity error against u = ε − x_0, each sum taken element by element."""

    def error(v, row):
        values = [
            (float(a) - (float(e) - float(x))) ** 2
            for a, e, x in zip(v[row].flatten(), noise[row].flatten(), clean[row].flatten(), strict=True)
        ]
        return sum(values) / len(values)

    total = 0.0
    for chosen, rejected in pairs.tolist():
        chosen_gap = error(velocity, chosen) - error(reference_velocity, chosen)
        rejected_gap = error(velocity, rejected) - error(reference_velocity, rejected)
        z = -beta / 2 * (chosen_gap - rejected_gap)
        total += -math.log(1 / (1 + math.exp(-z)))
    return total / len(pairs)


@pytest.mark.parametrize("beta", [0.5, 20.0, 2000.0])
def test_pair_loss_matches_the_papers_formula_rederived_per_pair(beta):
    generator = torch.Generator().manual_seed(0)
    clean, noise = torch.randn(2, 4, 3, 5, generator=generator, dtype=torch.float64)
    reference = torch.randn(4, 3, 5, generator=generator, dtype=torch.float64)
    velocity = reference + 0.3 * torch.randn(4, 3, 5, generator=generator, dtype=torch.float64)
    pairs = torch.tensor([[0, 1], [3, 2], [0, 2]])
    loss, metrics = diffusion_dpo_pair_loss(velocity, reference, noise - clean, pairs, beta)
    want = rederived_loss(velocity, reference, clean, noise, pairs, beta)
    assert loss.item() == pytest.approx(want, rel=1e-10)
    assert metrics["dpo_loss"] == pytest.approx(want, rel=1e-10)


def test_equal_policy_and_reference_give_log_two_and_the_gradient_is_beta_over_four_per_pair():
    errors = torch.tensor([0.7, 1.3, 0.2], dtype=torch.float64)
    chosen = errors.clone().requires_grad_()
    rejected = (errors + 0.5).requires_grad_()
    beta = 3.0
    loss, metrics = diffusion_dpo_loss(chosen, rejected, errors, errors + 0.5, beta)
    assert loss.item() == pytest.approx(math.log(2), rel=1e-12)
    assert metrics["dpo_accuracy"] == 0.0 and metrics["dpo_margin"] == 0.0
    loss.backward()
    # d/de⁺ of −log sigmoid(−β/2·(e⁺ − e⁻)) at 0 is β/4, averaged over 3 pairs; the rejected side the opposite
    assert torch.allclose(chosen.grad, torch.full((3,), beta / 4 / 3, dtype=torch.float64))
    assert torch.allclose(rejected.grad, torch.full((3,), -beta / 4 / 3, dtype=torch.float64))


def test_a_gradient_step_lowers_the_chosen_error_and_raises_the_rejected_one():
    generator = torch.Generator().manual_seed(1)
    clean, noise, reference = torch.randn(3, 2, 8, generator=generator)
    target = noise - clean
    velocity = reference.clone().requires_grad_()
    loss, _ = diffusion_dpo_pair_loss(velocity, reference, target, torch.tensor([[0, 1]]), beta=10.0)
    loss.backward()
    with torch.no_grad():
        stepped = velocity - 0.01 * velocity.grad
        before, after = velocity_matching_error(velocity, target), velocity_matching_error(stepped, target)
    assert after[0] < before[0] and after[1] > before[1]
    _, metrics = diffusion_dpo_pair_loss(stepped, reference, target, torch.tensor([[0, 1]]), beta=10.0)
    assert metrics["dpo_accuracy"] == 1.0 and metrics["chosen_improvement"] > 0 > metrics["rejected_improvement"]


def test_the_reference_gets_no_gradient_and_a_large_margin_does_not_overflow():
    target = torch.tensor([[0.0] * 4, [100.0] * 4])
    # the reference matches the chosen row exactly, the policy misses it by 100: the argument is -5e9
    reference = target.clone().requires_grad_()
    velocity = torch.zeros(2, 4, requires_grad=True)
    loss, metrics = diffusion_dpo_pair_loss(velocity, reference, target, torch.tensor([[1, 0]]), beta=1e6)
    assert torch.isfinite(loss) and loss.item() == pytest.approx(5e9, rel=1e-6)
    assert metrics["dpo_accuracy"] == 0.0
    loss.backward()
    assert reference.grad is None and velocity.grad is not None


def test_bad_inputs_name_what_to_fix():
    e = torch.zeros(2)
    with pytest.raises(ValueError, match="algorithm.beta must be > 0"):
        diffusion_dpo_loss(e, e, e, e, beta=0.0)
    with pytest.raises(ValueError, match=r"share one \[P\] shape"):
        diffusion_dpo_loss(e, torch.zeros(3), e, e, beta=1.0)
    with pytest.raises(ValueError, match="non-empty"):
        diffusion_dpo_pair_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(0, 2), 1.0)


def test_best_worst_pairs_each_groups_extremes_and_skips_equal_groups():
    scores = torch.tensor([0.2, 0.9, 0.5, 0.4, 0.4, 0.1, 0.7, 0.7])
    uids = ["a", "a", "a", "b", "b", "c", "c", "c"]
    pairs = preference_pairs(scores, uids, "best_worst")
    # group b is all equal; in c the first of the two best is chosen
    assert pairs.tolist() == [[1, 0], [6, 5]]


def test_margin_pairs_every_ordered_pair_above_the_margin_in_non_contiguous_groups():
    scores = torch.tensor([0.0, 1.0, 0.5, 0.3, 0.45])
    uids = [0, 1, 0, 1, 0]
    pairs = preference_pairs(scores, uids, "margin", reward_margin=0.2)
    assert sorted(map(tuple, pairs.tolist())) == [(1, 3), (2, 0), (4, 0)]
    assert preference_pairs(scores, uids, "best_worst", reward_margin=0.6).tolist() == [[1, 3]]
    assert preference_pairs(scores, uids, "margin", reward_margin=5.0).shape == (0, 2)


def test_bad_pairing_settings_name_the_key():
    scores = torch.tensor([0.0, 1.0])
    with pytest.raises(ValueError, match="algorithm.pairing must be one of"):
        preference_pairs(scores, [0, 0], "all")
    with pytest.raises(ValueError, match="algorithm.reward_margin must be >= 0"):
        preference_pairs(scores, [0, 0], "margin", reward_margin=-0.1)
    with pytest.raises(ValueError, match="index"):
        preference_pairs(scores, [0], "margin")

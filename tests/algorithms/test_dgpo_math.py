"""DGPO's group loss against an independent re-derivation on small tensors, a case worked by hand, and its gradient
against the authors' form.

The re-derivation follows the paper's objective (Luo et al., 2025, arXiv:2510.08425): per prompt group, the positive
and negative sub-groups by the advantage's sign, each sample's implicit reward −β·(e_θ − e_ref) weighted by |A|/G (the
authors' ``scripts/train_sd3_dgpo.py`` of Luo-Yihong/DGPO divides by the group size), and −log σ(R⁺ − R⁻), written
per group in float64 with plain Python arithmetic. The gradient is compared with the authors' surrogate
mean_i sg[σ(S_g)]·A_i·e_θ(x_i) (same file, ``compute_group_dgpo_loss_allreduce``), written here from its formula.
"""

import math

import pytest
import torch

from verl_omni.algorithms.dgpo_math import group_preference_loss


def rederived_objective(policy, reference, advantages, groups, beta) -> float:
    """Mean over groups of −log σ(R(G⁺) − R(G⁻)), R(G) = Σ_{i∈G} |A_i|/G · (−β·(e_θ,i − e_ref,i))."""
    losses = []
    for group in dict.fromkeys(groups):
        members = [i for i, g in enumerate(groups) if g == group]
        size = len(members)

        def reward(i):
            return -beta * (policy[i] - reference[i])

        positive = sum(abs(advantages[i]) / size * reward(i) for i in members if advantages[i] > 0)
        negative = sum(abs(advantages[i]) / size * reward(i) for i in members if advantages[i] < 0)
        losses.append(-math.log(1 / (1 + math.exp(-(positive - negative)))))
    return sum(losses) / len(losses)


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    groups = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]
    reference = torch.rand(12, generator=g, dtype=torch.float64) + 0.5
    policy = reference + 0.01 * torch.randn(12, generator=g, dtype=torch.float64)
    advantages = torch.randn(12, generator=g, dtype=torch.float64)
    # zero-mean within each group, as group normalisation gives
    advantages = advantages - advantages.view(3, 4).mean(dim=1).repeat_interleave(4)
    return policy, reference, advantages, groups


@pytest.mark.parametrize("beta", [1.0, 100.0, 2000.0])
def test_objective_matches_the_papers_group_likelihood_rederived_per_group(beta):
    policy, reference, advantages, groups = _batch()
    loss, metrics = group_preference_loss(policy, reference, advantages, torch.tensor(groups), beta)
    want = rederived_objective(policy.tolist(), reference.tolist(), advantages.tolist(), groups, beta)
    assert metrics["dgpo_loss"] == pytest.approx(want, rel=1e-10)
    # equal group sizes: the trained loss is the objective over β (the mean over samples of their group's loss / β)
    assert loss.item() == pytest.approx(want / beta, rel=1e-10)


def test_a_case_worked_by_hand():
    # one group of two: A = (+1, −1); the policy improves the positive sample by 0.01, worsens the negative by 0.01;
    # S = β/G·Σ A·Δ = 100/2·(1·(−0.01) + (−1)·0.01) = −1, loss = log(1 + e^{−1}), weight σ(−1)
    policy = torch.tensor([0.49, 0.31], dtype=torch.float64, requires_grad=True)
    reference = torch.tensor([0.50, 0.30], dtype=torch.float64)
    loss, metrics = group_preference_loss(policy, reference, torch.tensor([1.0, -1.0]), torch.tensor([7, 7]), 100.0)
    assert metrics["dgpo_loss"] == pytest.approx(math.log(1 + math.exp(-1)), rel=1e-12)
    assert loss.item() == pytest.approx(math.log(1 + math.exp(-1)) / 100, rel=1e-12)
    assert metrics["dgpo_margin"] == pytest.approx(1.0, rel=1e-12) and metrics["dgpo_accuracy"] == 1.0
    assert metrics["group_weight_mean"] == pytest.approx(1 / (1 + math.e), rel=1e-12)
    assert metrics["positive_improvement"] == pytest.approx(0.01) and metrics["negative_improvement"] == pytest.approx(
        -0.01
    )
    loss.backward()
    # d/de_i of the mean over the 2 samples of softplus(S)/β: σ(S)·A_i/2, lowering the positive sample's error
    weight = 1 / (1 + math.e)
    torch.testing.assert_close(policy.grad, torch.tensor([weight / 2, -weight / 2], dtype=torch.float64))


def test_gradient_equals_the_authors_surrogate_and_the_reference_gets_none():
    policy, reference, advantages, groups = _batch(seed=3)
    beta = 50.0
    ours = policy.clone().requires_grad_(True)
    ref = reference.clone().requires_grad_(True)
    loss, _ = group_preference_loss(ours, ref, advantages, torch.tensor(groups), beta)
    loss.backward()
    # the authors' form: per-group S_g = Σ A·β·(e − e_ref)/G, weight sg[σ(S_g)], loss mean(weight·A·e)
    theirs = policy.clone().requires_grad_(True)
    sums = {g: 0.0 for g in groups}
    for i, g in enumerate(groups):
        sums[g] += float(advantages[i]) * beta * float(policy[i] - reference[i]) / groups.count(g)
    weights = torch.tensor([1 / (1 + math.exp(-sums[g])) for g in groups], dtype=torch.float64)
    (weights * advantages * theirs).mean().backward()
    torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-12, atol=1e-15)
    assert ref.grad is None


def test_an_equal_reward_group_adds_a_constant_and_no_gradient():
    policy = torch.tensor([0.4, 0.6, 0.5, 0.5], dtype=torch.float64, requires_grad=True)
    reference = torch.tensor([0.5, 0.5, 0.5, 0.5], dtype=torch.float64)
    advantages = torch.tensor([0.0, 0.0, 1.0, -1.0], dtype=torch.float64)
    loss, metrics = group_preference_loss(policy, reference, advantages, torch.tensor([0, 0, 1, 1]), 10.0)
    assert metrics["dgpo_loss"] == pytest.approx(math.log(2))
    loss.backward()
    assert policy.grad[:2].tolist() == [0.0, 0.0] and bool((policy.grad[2:] != 0).all())


def test_bad_inputs_are_refused():
    errors = torch.ones(4)
    with pytest.raises(ValueError, match="algorithm.beta must be > 0"):
        group_preference_loss(errors, errors, errors, torch.zeros(4), 0.0)
    with pytest.raises(ValueError, match="share one"):
        group_preference_loss(errors, errors[:3], errors, torch.zeros(4), 1.0)

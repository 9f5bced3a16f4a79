"""Flow-GRPO advantage and loss: edge cases, clipping, gradient direction, and the registered algorithm's use."""

import numpy as np
import pytest
import torch

from verl_omni.algorithms import get_algorithm
from verl_omni.algorithms.flow_grpo_math import compute_flow_grpo_advantage, compute_flow_grpo_policy_loss


def test_advantage_matches_numpy_with_global_std():
    scores = torch.tensor([1.0, 2.0, 3.0, 10.0, 10.0, 13.0])
    uids = ["a", "a", "a", "b", "b", "b"]
    r = scores.numpy().astype(np.float64)
    means = np.array([2.0, 2.0, 2.0, 11.0, 11.0, 11.0])
    want = (r - means) / (r.std() + 1e-4)
    got = compute_flow_grpo_advantage(scores, uids, global_std=True, adv_clip_max=100)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)


def test_advantage_with_per_group_std_normalizes_each_group():
    scores = torch.tensor([1.0, 3.0, 100.0, 300.0])
    got = compute_flow_grpo_advantage(scores, [0, 0, 1, 1], global_std=False, adv_clip_max=100)
    np.testing.assert_allclose(got.numpy(), [-1, 1, -1, 1], atol=1e-3)


def test_zero_variance_and_size_one_groups_get_zero_advantage():
    scores = torch.tensor([5.0, 5.0, 5.0, 7.0, 1.0, 2.0])
    got = compute_flow_grpo_advantage(scores, ["z", "z", "z", "single", "g", "g"], global_std=False)
    assert got[:4].abs().max() == 0
    assert got[4] < 0 < got[5]


def test_advantage_is_clipped_on_both_sides():
    scores = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 100.0])
    got = compute_flow_grpo_advantage(scores, [0] * 8, adv_clip_max=1.5)
    assert got.max() == pytest.approx(1.5) and got.min() > -1.5
    got = compute_flow_grpo_advantage(-scores, [0] * 8, adv_clip_max=1.5)
    assert got.min() == pytest.approx(-1.5)


@pytest.mark.parametrize(
    "scores, index, match",
    [
        (torch.tensor([1.0, 2.0, 3.0]), ["a", "a"], "index"),
        (torch.tensor([1.0, float("nan")]), ["a", "a"], "NaN"),
        (torch.ones(2, 2), ["a", "a"], "1-D"),
    ],
)
def test_advantage_bad_input_raises(scores, index, match):
    with pytest.raises(ValueError, match=match):
        compute_flow_grpo_advantage(scores, index)


def _loss(log_prob, old, adv, **kw):
    return compute_flow_grpo_policy_loss(log_prob, old, adv, **kw)


def test_loss_at_ratio_one_is_minus_mean_advantage():
    adv = torch.tensor([1.0, -2.0, 0.5])
    lp = torch.tensor([-3.0, -1.0, -2.0])
    loss, m = _loss(lp, lp.clone(), adv)
    assert loss.item() == pytest.approx(-adv.mean().item())
    assert m["ratio_mean"] == pytest.approx(1.0) and m["pg_clipfrac"] == 0 and m["ppo_kl"] == 0


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_gradient_raises_log_prob_of_positive_advantage_and_lowers_negative(sign):
    lp = torch.zeros(4, requires_grad=True)
    loss, _ = _loss(lp, torch.zeros(4), torch.full((4,), sign))
    loss.backward()
    # gradient descent moves log_prob against the gradient: up for A > 0, down for A < 0
    assert torch.all(-lp.grad * sign > 0)


def test_ratio_clip_on_both_sides_stops_the_gradient_and_counts_clipfrac():
    eps = 0.1
    old = torch.zeros(4)
    # A>0 with ρ above 1+ε and A<0 with ρ below 1−ε are clipped; the other two are not
    lp = torch.tensor([0.5, -0.5, 0.5, -0.5], requires_grad=True)
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0])
    loss, m = _loss(lp, old, adv, clip_ratio=eps)
    loss.backward()
    assert lp.grad[0] == 0 and lp.grad[1] == 0
    assert lp.grad[2] != 0 and lp.grad[3] != 0
    assert m["pg_clipfrac"] == pytest.approx(0.5)
    ratio = torch.exp(lp.detach())
    want = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - eps, 1 + eps)).mean()
    assert m["pg_loss"] == pytest.approx(want.item())
    assert m["ratio_max_abs_dev"] == pytest.approx((ratio - 1).abs().max().item())


def test_truncated_is_gradient_is_advantage_times_capped_weight_times_grad_log_prob():
    # weights 0.5, 1, 3 (capped at C=2), 1.5: the gradient of each log π_θ is −A·min(w, C)/B, no clip
    old = torch.zeros(4)
    lp = torch.log(torch.tensor([0.5, 1.0, 3.0, 1.5])).requires_grad_(True)
    adv = torch.tensor([1.0, -2.0, 0.5, 1.0])
    loss, m = _loss(lp, old, adv, is_threshold=2.0)
    loss.backward()
    weight = torch.tensor([0.5, 1.0, 2.0, 1.5])
    torch.testing.assert_close(lp.grad, -adv * weight / 4)
    assert m["pg_loss"] == pytest.approx((-adv * weight).mean().item())
    assert m["is_truncated_frac"] == pytest.approx(0.25) and "pg_clipfrac" not in m


def test_a_bf16_sized_rollout_gap_clips_the_ratio_but_not_the_truncated_weight():
    # the rollout's log-probs stand in for π_old, off from the actor's by 4e-4 either way (bf16 numerics) with
    # clip_ratio 1e-4: the clipped ratio drops every sample whose gap points the way its advantage pushes, before any
    # optimizer step; the truncated weight keeps each sample's full gradient
    gap = torch.tensor([4e-4, -4e-4, 4e-4, -4e-4])
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0])
    grads = {}
    for name, kw in (("clip", {}), ("tis", {"is_threshold": 2.0})):
        lp = torch.zeros(4, requires_grad=True)
        loss, _ = _loss(lp, -gap, adv, clip_ratio=1e-4, **kw)
        loss.backward()
        grads[name] = lp.grad
    assert grads["clip"][0] == 0 and grads["clip"][1] == 0
    torch.testing.assert_close(grads["tis"], -adv * torch.exp(gap) / 4)


def test_truncated_is_threshold_below_one_is_refused():
    with pytest.raises(ValueError, match="is_threshold"):
        _loss(torch.zeros(2), torch.zeros(2), torch.ones(2), is_threshold=0.5)


def test_kl_term_matches_formula_and_is_weighted_by_beta():
    mu = torch.randn(2, 3, 4)
    mu_ref = torch.randn(2, 3, 4)
    s = torch.tensor([0.5, 2.0]).view(2, 1, 1)
    lp = torch.zeros(2)
    loss, m = _loss(lp, lp, torch.zeros(2), kl_beta=0.04, prev_sample_mean=mu, ref_prev_sample_mean=mu_ref, std_dev_t=s)
    want = (((mu - mu_ref) ** 2).mean(dim=(1, 2)) / (2 * s.flatten() ** 2)).mean()
    assert m["kl_loss"] == pytest.approx(want.item(), rel=1e-6)
    assert loss.item() == pytest.approx(0.04 * want.item(), rel=1e-6)


def test_loss_raises_when_kl_inputs_or_old_log_probs_missing():
    lp = torch.zeros(2)
    with pytest.raises(ValueError, match="ref_prev_sample_mean"):
        _loss(lp, lp, lp, kl_beta=0.1, prev_sample_mean=torch.zeros(2, 3), std_dev_t=torch.ones(2))
    with pytest.raises(ValueError, match="old_log_prob"):
        _loss(lp, None, lp)
    with pytest.raises(ValueError, match="advantages"):
        _loss(lp, lp, torch.zeros(3))


def test_the_registered_flow_grpo_advantage_is_this_math_with_its_config():
    # one home for the math: the algorithm the trainer looks up computes exactly these functions' result
    algorithm = get_algorithm("flow_grpo")
    scores = torch.tensor([1.0, 2.0, 3.0, 10.0, 10.0, 40.0])
    uids = ["a", "a", "a", "b", "b", "b"]
    config = algorithm.config_cls(global_std=False, epsilon=1e-3, adv_clip_max=1.2)
    want = compute_flow_grpo_advantage(scores, uids, global_std=False, epsilon=1e-3, adv_clip_max=1.2)
    torch.testing.assert_close(algorithm.compute_advantage(scores, uids, config), want, rtol=0, atol=0)
    assert want.abs().max().item() == pytest.approx(1.2)  # the clip is in effect, not only the normalization


def test_zero_std_groups_marks_groups_of_equal_rewards_exactly_and_counts_their_share():
    from verl_omni.algorithms.flow_grpo_math import zero_std_groups

    # groups interleaved; 0.1 three times has a rounded mean != 0.1 but is still a group of equal rewards
    scores = torch.tensor([0.1, 1.0, 0.1, 0.0, 0.1, 1.0, 7.0])
    uids = ["tenth", "binary", "tenth", "binary", "tenth", "ones", "single"]
    zero_std, frac = zero_std_groups(scores, uids)
    assert zero_std.tolist() == [True, False, True, False, True, True, True]
    assert frac == pytest.approx(3 / 4)
    assert zero_std_groups(torch.tensor([1.0, 0.0]), ["a", "a"])[1] == 0.0
    with pytest.raises(ValueError, match="index"):
        zero_std_groups(scores, uids[:3])


@pytest.mark.parametrize("loss_type", ["ppo_clip", "reinforce"])
def test_the_flow_grpo_loss_reports_exactly_the_metrics_it_declares_for_its_rollout_correction(loss_type):
    from types import SimpleNamespace

    from verl_omni.workers.config.actor import DiffusionActorConfig, RolloutCorrectionConfig

    actor = DiffusionActorConfig(
        use_rollout_log_probs=True, rollout_correction=RolloutCorrectionConfig(loss_type=loss_type)
    )
    algorithm = get_algorithm("flow_grpo")
    loss_fn = algorithm.build_loss(actor, algorithm.config_cls())
    batch = {"rollout_log_probs": torch.zeros(3, 2), "advantages": torch.tensor([1.0, -1.0, 0.5])}
    replayed = SimpleNamespace(log_prob=torch.full((3,), 1e-3), prev_sample_mean=None, std_dev_t=None)
    _, metrics = loss_fn(replayed, batch, step=0)
    assert set(metrics) == set(loss_fn.metric_reductions)
    assert ("is_truncated_frac" in metrics) == (loss_type == "reinforce") != ("pg_clipfrac" in metrics)

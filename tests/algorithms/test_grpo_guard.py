"""GRPO-Guard's loss against a re-derivation written here, from Gaussian transitions drawn in the test.

For one SDE step the transition is N(μ, σ²) per latent dim with σ = s·√−Δt, and the log-prob is the
mean over dims. A transition drawn from π_old is x' = μ_old + σ·ε, so with Δ = μ_θ − μ_old:
log π_θ − log π_old + mean(Δ²)/(2σ²) = mean(ε·Δ)/σ, and the normalized ratio is exp(mean(ε·Δ)).
The tests compute that closed form, never the library's expression.
"""

from __future__ import annotations

import math

import pytest
import torch

from verl_omni.algorithms.grpo_guard import compute_grpo_guard_policy_loss


def _gaussian_log_prob(x_next, mean, step_std):
    """Mean over dims of log N(x'; μ, σ²), σ per sample ``[B]``."""
    std = step_std[:, None]
    return (-((x_next - mean) ** 2) / (2 * std**2) - torch.log(std) - 0.5 * math.log(2 * math.pi)).mean(dim=1)


def _draw(batch=6, dims=64, seed=0, delta_scale=0.05):
    g = torch.Generator().manual_seed(seed)
    s = 0.3 + torch.rand(batch, generator=g)
    dt = -(0.05 + 0.2 * torch.rand(batch, generator=g))
    step_std = s * torch.sqrt(-dt)
    mu_old = torch.randn(batch, dims, generator=g)
    eps = torch.randn(batch, dims, generator=g)
    delta = delta_scale * torch.randn(batch, dims, generator=g)
    return s, dt, step_std, mu_old, eps, delta


def _guard(mu_theta, mu_old, eps, s, dt, step_std, adv, clip=0.2, **kw):
    x_next = mu_old + step_std[:, None] * eps
    lp = _gaussian_log_prob(x_next, mu_theta, step_std)
    old = _gaussian_log_prob(x_next, mu_old, step_std)
    return compute_grpo_guard_policy_loss(lp, old, adv, mu_theta, mu_old, s[:, None], dt, clip, **kw)


def test_loss_and_gradient_match_the_closed_form():
    s, dt, step_std, mu_old, eps, delta = _draw()
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0])
    mu_theta = (mu_old + delta).requires_grad_(True)
    loss, metrics = _guard(mu_theta, mu_old, eps, s, dt, step_std, adv)
    (grad,) = torch.autograd.grad(loss, mu_theta)

    mu_ref = (mu_old + delta).requires_grad_(True)
    ratio = torch.exp((eps * (mu_ref - mu_old)).mean(dim=1))
    per_sample = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    expected = (per_sample / (-dt)).mean()
    (expected_grad,) = torch.autograd.grad(expected, mu_ref)

    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-4, atol=1e-7)
    assert metrics["ratio_mean_bias"] == pytest.approx(((delta**2).mean(1) / (2 * step_std**2)).mean().item(), rel=1e-5)
    assert metrics["step_weight_mean"] == pytest.approx((1 / -dt).mean().item(), rel=1e-6)


def test_on_policy_step_has_ratio_one_and_no_bias():
    """The first inner step (θ = old): Δ = 0, so the bias is 0 and the ratio exactly 1."""
    s, dt, step_std, mu_old, eps, _ = _draw()
    adv = torch.linspace(-1, 1, 6)
    loss, metrics = _guard(mu_old.clone(), mu_old, eps, s, dt, step_std, adv)
    assert metrics["ratio_mean_bias"] == 0.0
    assert metrics["ratio_max_abs_dev"] == 0.0
    assert metrics["pg_clipfrac"] == 0.0
    torch.testing.assert_close(loss, (-adv / (-dt)).mean())


def test_raw_log_ratio_is_left_shifted_and_ratio_norm_recentres_it():
    """The paper's observation: under π_old the raw log-ratio's mean is −mean(Δ²)/(2σ²) < 0 (ratio mean < 1)."""
    batch = 4000
    s, dt, step_std, mu_old, eps, delta = _draw(batch=batch, dims=16, seed=1, delta_scale=0.3)
    mu_theta = mu_old + delta
    x_next = mu_old + step_std[:, None] * eps
    raw = _gaussian_log_prob(x_next, mu_theta, step_std) - _gaussian_log_prob(x_next, mu_old, step_std)
    shift = ((delta**2).mean(1) / (2 * step_std**2)).mean()
    assert raw.mean() < -0.5 * shift
    _, metrics = _guard(mu_theta, mu_old, eps, s, dt, step_std, torch.zeros(batch), clip=10.0)
    assert metrics["raw_ratio_mean"] < 1
    # E[mean(ε·Δ)] = 0: the normalized log-ratio is centred (log of ratio_mean ≈ its variance / 2, small)
    assert abs(math.log(metrics["ratio_mean"])) < 0.02 < abs(math.log(metrics["raw_ratio_mean"]))


def test_normalized_ratio_spread_no_longer_depends_on_the_step_noise():
    """Same Δ and draws, two step stds: the raw log-ratio scales with 1/σ, the normalized one does not."""
    _, _, _, mu_old, eps, delta = _draw(batch=1, dims=256, seed=2, delta_scale=0.1)
    logs = {}
    for s_value in (0.2, 1.0):
        s, dt = torch.tensor([s_value]), torch.tensor([-0.1])
        step_std = s * torch.sqrt(-dt)
        _, metrics = _guard(mu_old + delta, mu_old, eps, s, dt, step_std, torch.zeros(1), clip=10.0)
        logs[s_value] = (math.log(metrics["raw_ratio_mean"]), math.log(metrics["ratio_mean"]))
    assert logs[0.2][1] == pytest.approx(logs[1.0][1], rel=1e-4)
    assert abs(logs[0.2][0]) > 3 * abs(logs[1.0][0])


def test_reweighting_equalizes_the_gradient_over_step_sizes():
    """μ_θ − μ_old = Δt·δv (the kernel's velocity term): with 1/(−Δt) each step's gradient in δv is the same."""
    dims = 32
    eps = torch.randn(1, dims, generator=torch.Generator().manual_seed(3)).repeat(2, 1)
    mu_old = torch.zeros(2, dims)
    dt = torch.tensor([-0.02, -0.3])
    s = torch.tensor([0.7, 0.7])
    step_std = s * torch.sqrt(-dt)
    grads = {}
    for reweight in (True, False):
        dv = torch.zeros(2, dims, requires_grad=True)
        loss, _ = _guard(mu_old + dt[:, None] * dv, mu_old, eps, s, dt, step_std, torch.ones(2), grad_reweight=reweight)
        (grads[reweight],) = torch.autograd.grad(loss, dv)
    torch.testing.assert_close(grads[True][0], grads[True][1])
    ratio = grads[False][1].norm() / grads[False][0].norm()
    assert ratio.item() == pytest.approx(0.3 / 0.02, rel=1e-4)


def test_over_confident_positive_sample_is_clipped():
    """A positive-advantage sample whose normalized ratio left [1−ε, 1+ε] gets no gradient."""
    dims = 8
    eps = torch.ones(1, dims)
    mu_old = torch.zeros(1, dims)
    s, dt = torch.tensor([0.5]), torch.tensor([-0.1])
    step_std = s * torch.sqrt(-dt)
    mu_theta = torch.full((1, dims), 0.5, requires_grad=True)  # normalized ratio exp(0.5) > 1.2
    loss, metrics = _guard(mu_theta, mu_old, eps, s, dt, step_std, torch.ones(1))
    (grad,) = torch.autograd.grad(loss, mu_theta)
    assert metrics["pg_clipfrac"] == 1.0
    assert torch.count_nonzero(grad) == 0
    torch.testing.assert_close(loss, torch.tensor(-1.2 / 0.1))


def test_both_parts_off_is_flow_grpo_policy_loss():
    from verl_omni.algorithms.flow_grpo_math import compute_flow_grpo_policy_loss

    s, dt, step_std, mu_old, eps, delta = _draw(delta_scale=0.3)
    adv = torch.linspace(-2, 2, 6)
    x_next = mu_old + step_std[:, None] * eps
    lp = _gaussian_log_prob(x_next, mu_old + delta, step_std)
    old = _gaussian_log_prob(x_next, mu_old, step_std)
    guard, _ = compute_grpo_guard_policy_loss(
        lp, old, adv, mu_old + delta, mu_old, s, dt, 0.2, ratio_norm=False, grad_reweight=False
    )
    flow, _ = compute_flow_grpo_policy_loss(lp, old, adv, clip_ratio=0.2)
    torch.testing.assert_close(guard, flow)


def test_non_negative_dt_and_shape_mismatch_are_errors():
    s, dt, step_std, mu_old, eps, delta = _draw()
    with pytest.raises(ValueError, match="dt must be < 0"):
        _guard(mu_old + delta, mu_old, eps, s, -dt, step_std.abs(), torch.zeros(6))
    with pytest.raises(ValueError, match="old_prev_sample_mean"):
        compute_grpo_guard_policy_loss(
            torch.zeros(6), torch.zeros(6), torch.zeros(6), mu_old, mu_old[:, :3], s, dt, 0.2
        )


def _shared_step_batch(seed=4, batch=6, dims=48):
    """Samples at one step (one s, one Δt), each drifted by its own amount, as in the authors' batches; fp64, so
    the small gap between the two reductions stands far above rounding."""
    g = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    s, dt = torch.full((batch,), 0.7, dtype=f64), torch.full((batch,), -0.08, dtype=f64)
    step_std = s * torch.sqrt(-dt)
    mu_old = torch.randn(batch, dims, generator=g, dtype=f64)
    eps = torch.randn(batch, dims, generator=g, dtype=f64)
    scales = torch.logspace(-3, math.log10(3e-2), batch, dtype=f64)[:, None]
    delta = scales * torch.randn(batch, dims, generator=g, dtype=f64)
    return s, dt, step_std, mu_old, eps, delta


def _authors_form(mu_theta, mu_old, eps, s_value, dt_value, adv, clip=0.2):
    """The reduction of flow_grpo's scripts/train_sd3_GRPO_Guard.py, re-derived with scalars: one shift, the mean
    of (μ_θ − μ_old)² over every element of the batch over 2σ², added to every sample's log-ratio; the policy loss
    divided by (√−Δt)²."""
    step_std = s_value * math.sqrt(-dt_value)
    x_next = mu_old + step_std * eps
    log_ratio = ((x_next - mu_old) ** 2 - (x_next - mu_theta) ** 2).mean(dim=1) / (2 * step_std**2)
    shift = ((mu_theta - mu_old) ** 2).mean() / (2 * step_std**2)
    ratio = torch.exp((log_ratio + shift) * step_std)
    per_sample = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip))
    return per_sample.mean() / (-dt_value)


def test_batch_reduction_matches_the_authors_form_and_sample_reduction_differs_from_it():
    """At a shared step the two reductions still differ (each sample drifts by its own amount); ``batch`` is the
    authors' loss and gradient, ``sample`` is the closed form exp(mean(ε·Δ)) per sample."""
    s, dt, step_std, mu_old, eps, delta = _shared_step_batch()
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0], dtype=torch.float64)
    results = {}
    for reduce in ("sample", "batch"):
        mu_theta = (mu_old + delta).requires_grad_(True)
        loss, _ = _guard(mu_theta, mu_old, eps, s, dt, step_std, adv, ratio_norm_reduce=reduce)
        results[reduce] = (loss, *torch.autograd.grad(loss, mu_theta))

    mu_ref = (mu_old + delta).requires_grad_(True)
    authors = _authors_form(mu_ref, mu_old, eps, 0.7, -0.08, adv)
    (authors_grad,) = torch.autograd.grad(authors, mu_ref)
    torch.testing.assert_close(results["batch"][0], authors, rtol=1e-10, atol=0)
    torch.testing.assert_close(results["batch"][1], authors_grad, rtol=1e-9, atol=1e-12)

    mu_ref = (mu_old + delta).requires_grad_(True)
    ratio = torch.exp((eps * (mu_ref - mu_old)).mean(dim=1))
    closed = (torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2)) / (-dt)).mean()
    (closed_grad,) = torch.autograd.grad(closed, mu_ref)
    torch.testing.assert_close(results["sample"][0], closed, rtol=1e-10, atol=0)
    torch.testing.assert_close(results["sample"][1], closed_grad, rtol=1e-9, atol=1e-12)

    loss_gap = (results["sample"][0] - results["batch"][0]).abs() / results["sample"][0].abs()
    assert loss_gap > 1e-7
    grad_gap = (results["sample"][1] - results["batch"][1]).norm() / results["sample"][1].norm()
    assert grad_gap > 1e-3


def test_reductions_agree_when_every_sample_drifts_alike():
    """With the same ‖μ_θ − μ_old‖² in every sample the batch mean of the shift is each sample's shift."""
    s, dt, step_std, mu_old, eps, _ = _shared_step_batch()
    g = torch.Generator().manual_seed(5)
    delta = 0.02 * torch.randn(1, mu_old.shape[1], generator=g, dtype=torch.float64).repeat(6, 1)
    adv = torch.linspace(-1, 1, 6, dtype=torch.float64)
    losses = [
        _guard(mu_old + delta, mu_old, eps, s, dt, step_std, adv, ratio_norm_reduce=r)[0] for r in ("sample", "batch")
    ]
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-12, atol=0)


def test_unknown_ratio_norm_reduce_names_the_key():
    from verl_omni.algorithms.grpo_guard import GRPOGuardConfig

    with pytest.raises(ValueError, match="algorithm.ratio_norm_reduce must be one of"):
        GRPOGuardConfig(ratio_norm_reduce="mean")
    s, dt, step_std, mu_old, eps, delta = _draw()
    with pytest.raises(ValueError, match="ratio_norm_reduce must be one of"):
        _guard(mu_old + delta, mu_old, eps, s, dt, step_std, torch.zeros(6), ratio_norm_reduce="mean")

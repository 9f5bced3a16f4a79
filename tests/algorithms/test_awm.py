"""Advantage Weighted Matching's loss, weighting and step choice against re-derivations written here.

The re-derivation draws ε itself and measures the error against v = ε − x_0 directly; the library recovers
the target from (x_σ, x_0, σ) alone, which is what the engine hands it. The authors' form (a PPO ratio of
exp(−matching loss) between the trained and the sampling policy) is re-derived here too: at ratio 1 its
gradient is the library loss's.
"""

from __future__ import annotations

import pytest
import torch

from verl_omni.algorithms import get_algorithm
from verl_omni.algorithms.awm import AWM, WEIGHTINGS, AWMConfig, AWMLoss, awm_policy_loss, stratified_steps


def _draw(batch=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    clean = torch.randn(batch, 4, 12, generator=g, dtype=torch.float64)
    eps = torch.randn(batch, 4, 12, generator=g, dtype=torch.float64)
    sigma = 0.05 + 0.9 * torch.rand(batch, generator=g, dtype=torch.float64)
    s = sigma[:, None, None]
    noisy = (1 - s) * clean + s * eps
    velocity = (eps - clean) + 0.4 * torch.randn(batch, 4, 12, generator=g, dtype=torch.float64)
    advantages = torch.tensor([2.0, -1.0, 7.5, -6.0, 0.0, 0.5], dtype=torch.float64)[:batch]
    return clean, eps, sigma, noisy, velocity, advantages


def _reference_per_sample(velocity, eps, clean, sigma, weighting, p=0.25):
    err = ((velocity - (eps - clean)) ** 2).flatten(1).mean(1)
    return {
        "uniform": err,
        "sigma": sigma * err,
        "sigma_squared": sigma * sigma * err,
        "ghuber": sigma * ((err + 1e-10) ** p - 1e-10**p) / p,
    }[weighting]


@pytest.mark.parametrize("weighting", WEIGHTINGS)
def test_loss_equals_the_advantage_weighted_matching_rederivation(weighting):
    clean, eps, sigma, noisy, velocity, advantages = _draw()
    config = AWMConfig(weighting=weighting, adv_clip_max=5.0)
    loss, metrics = awm_policy_loss(velocity, noisy, clean, sigma, advantages, config)
    # clip to ±5, then scale to [−1, 1]: 7.5 -> 1, −6 -> −1
    weights = torch.tensor([0.4, -0.2, 1.0, -1.0, 0.0, 0.1], dtype=torch.float64)
    expected = (weights * _reference_per_sample(velocity, eps, clean, sigma, weighting)).mean()
    torch.testing.assert_close(loss, expected, rtol=1e-10, atol=1e-12)
    assert metrics["policy_loss"] == pytest.approx(expected.item())
    assert metrics["advantage_weight_abs_mean"] == pytest.approx(weights.abs().mean().item())


@pytest.mark.parametrize("weighting", WEIGHTINGS)
def test_gradient_equals_the_authors_ratio_form_at_ratio_one(weighting):
    clean, eps, sigma, noisy, velocity, advantages = _draw(seed=3)
    config = AWMConfig(weighting=weighting)
    ours = velocity.clone().requires_grad_(True)
    awm_policy_loss(ours, noisy, clean, sigma, advantages, config)[0].backward()
    # the authors: log p = −w·error, ratio = exp(log p − log p_old) with the sampling policy's value (ratio 1
    # on the first optimizer step), loss = mean(−Â·ratio) (the clip does not act at ratio 1)
    theirs = velocity.clone().requires_grad_(True)
    log_p = -_reference_per_sample(theirs, eps, clean, sigma, weighting)
    ratio = torch.exp(log_p - log_p.detach())
    (-(advantages.clamp(-5, 5) / 5) * ratio).mean().backward()
    torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-9, atol=1e-12)
    assert ours.grad.abs().sum() > 0


def test_a_positive_advantage_pulls_toward_the_target_and_a_negative_one_pushes_away():
    clean, eps, sigma, noisy, velocity, _ = _draw(batch=2, seed=5)
    for sign in (1.0, -1.0):
        v = velocity.clone().requires_grad_(True)
        awm_policy_loss(v, noisy, clean, sigma, torch.tensor([sign, sign], dtype=torch.float64), AWMConfig())[
            0
        ].backward()
        # a small step against the gradient moves v toward ε − x_0 when A > 0 and away when A < 0
        before = ((velocity - (eps - clean)) ** 2).sum()
        after = ((velocity - 1e-2 * v.grad - (eps - clean)) ** 2).sum()
        assert bool(after < before) is (sign > 0)


def test_zero_advantages_train_nothing():
    clean, _, sigma, noisy, velocity, _ = _draw()
    v = velocity.clone().requires_grad_(True)
    awm_policy_loss(v, noisy, clean, sigma, torch.zeros(6, dtype=torch.float64), AWMConfig())[0].backward()
    assert torch.count_nonzero(v.grad) == 0


def test_stratified_steps_take_one_step_from_each_stratum_of_the_allowed_fraction():
    torch.manual_seed(0)
    for _ in range(50):
        # T = 14, 0.9 -> the first 12 steps in 6 strata of 2: one from each
        steps = stratified_steps(14, 0.9, 6)
        assert [s // 2 for s in steps] == list(range(6))
    # fewer allowed steps than asked: each allowed step once
    assert stratified_steps(4, 0.9, 6) == [0, 1, 2]
    assert stratified_steps(4, 0.1, 6) == [0]
    loss = AWMLoss(None, AWMConfig(num_train_steps=2, timestep_fraction=1.0))
    steps = loss.replay_steps(10)
    assert len(steps) == 2 and 0 <= steps[0] < 5 <= steps[1] < 10
    assert loss.required_keys == ("advantages",)


def test_advantage_is_group_centred_and_globally_scaled():
    scores = torch.tensor([1.0, 3.0, 2.0, 2.0, 0.0, 4.0])
    adv = AWM.compute_advantage(scores, ["a", "a", "b", "b", "c", "c"], AWMConfig())
    centred = torch.tensor([-1.0, 1.0, 0.0, 0.0, -2.0, 2.0])
    torch.testing.assert_close(adv, centred / (scores.std(unbiased=False) + 1e-4))


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"adv_clip_max": 0.0}, "algorithm.adv_clip_max"),
        ({"timestep_fraction": 0.0}, "algorithm.timestep_fraction"),
        ({"num_train_steps": 0}, "algorithm.num_train_steps"),
        ({"weighting": "t**2"}, "algorithm.weighting"),
        ({"ghuber_power": 2.0}, "algorithm.ghuber_power"),
    ],
)
def test_config_names_the_bad_key(kwargs, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        AWMConfig(**kwargs)


def test_declarations_no_log_probs_an_ode_record_no_extra_phase():
    from verl_omni.workers.config.actor import DiffusionActorConfig

    algorithm = get_algorithm("awm")
    phases = algorithm.phases(AWMConfig(), DiffusionActorConfig())
    assert algorithm.rollout_record == "ode_samples" and not algorithm.uses_log_probs
    assert (phases.old_log_prob, phases.reference, phases.old_policy_adapter) == (False, False, False)


def test_hydra_group_gives_the_defaults_and_an_ode_rollout_that_validates(compose):
    from verl_omni.trainer.config.validation import validate_config

    configs = validate_config(compose("algorithm=awm"))
    assert configs.algorithm == AWMConfig()
    assert configs.rollout.sampling_spec().noise_level == 0.0 and configs.rollout.true_cfg_scale == 1.0


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["actor_rollout_ref.rollout.noise_level=0.7"], "awm trains on ODE samples: set actor_rollout_ref.rollout"),
        (["actor_rollout_ref.actor.kl_beta=0.01"], "actor_rollout_ref.actor.kl_beta must be 0"),
        (["algorithm.weighting=huber"], "algorithm.weighting must be one of"),
    ],
)
def test_settings_the_algorithm_cannot_train_on_are_refused_naming_the_key(compose, overrides, message):
    from verl_omni.trainer.config.validation import validate_config

    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        validate_config(compose("algorithm=awm", *overrides))

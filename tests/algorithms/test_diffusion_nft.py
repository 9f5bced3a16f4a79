"""DiffusionNFT's reward normalization, loss and decay schedule against re-derivations written here.

Forward noising x_σ = (1 − σ)·x_0 + σ·ε has the flow-matching target v = ε − x_0, so a velocity u implies
x̂_0 = x_σ − σ·u and x̂_0 − x_0 = σ·(v − u). The adaptive loss of a policy u is then, per sample,
σ·mean((v − u)²) / mean|v − u|: the tests use that closed form in velocity space, never the library's
x_0-space expression.
"""

from __future__ import annotations

import pytest
import torch

from verl_omni.algorithms import get_algorithm
from verl_omni.algorithms.diffusion_nft import (
    DiffusionNFT,
    DiffusionNFTConfig,
    nft_policy_loss,
    optimality_probability,
)


def _draw(batch=5, dims=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    clean = torch.randn(batch, 4, dims // 4, generator=g)
    eps = torch.randn(batch, 4, dims // 4, generator=g)
    sigma = 0.1 + 0.8 * torch.rand(batch, generator=g)
    s = sigma[:, None, None]
    noisy = (1 - s) * clean + s * eps
    old = (eps - clean) + 0.3 * torch.randn(batch, 4, dims // 4, generator=g)
    velocity = old + 0.05 * torch.randn(batch, 4, dims // 4, generator=g)
    return clean, eps, sigma, noisy, old, velocity


def _adaptive(target, u, sigma):
    """σ·mean((v − u)²)/mean|v − u| per sample: the weighted x_0 error of velocity u."""
    diff = (target - u).flatten(1)
    return sigma * (diff**2).mean(1) / diff.abs().mean(1)


def _reference_loss(velocity, old, clean, eps, sigma, r, beta, scale):
    target = eps - clean
    positive = _adaptive(target, (1 - beta) * old + beta * velocity, sigma)
    negative = _adaptive(target, (1 + beta) * old - beta * velocity, sigma)
    return (scale * (r * positive + (1 - r) * negative) / beta).mean()


@pytest.mark.parametrize(
    ("adv", "expected"),
    [(0.0, 0.5), (5.0, 1.0), (-5.0, 0.0), (12.0, 1.0), (-7.5, 0.0), (2.5, 0.75), (-1.0, 0.4)],
)
def test_optimality_probability_maps_clipped_advantage_to_unit_interval(adv, expected):
    # r = 1/2 + 1/2·clip(A/c, −1, 1) with c = 5: r = 1 and r = 0 at and beyond the clip, 1/2 at the group mean
    assert optimality_probability(torch.tensor([adv]), 5.0).item() == pytest.approx(expected)


@pytest.mark.parametrize("beta", [1.0, 0.1, 1e-3])
def test_loss_equals_velocity_space_rederivation(beta):
    clean, eps, sigma, noisy, old, velocity = _draw()
    r = torch.tensor([0.0, 1.0, 0.5, 0.2, 0.9])
    loss, metrics = nft_policy_loss(velocity, old, noisy, clean, sigma, r, beta, scale=5.0)
    expected = _reference_loss(velocity, old, clean, eps, sigma, r, beta, 5.0)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    assert metrics["policy_loss"] == pytest.approx(expected.item(), rel=1e-5)
    assert metrics["old_deviate"] == pytest.approx(((velocity - old) ** 2).mean().item(), rel=1e-6)


def _grad(velocity, old, noisy, clean, sigma, r, beta):
    v = velocity.clone().requires_grad_(True)
    loss, _ = nft_policy_loss(v, old, noisy, clean, sigma, r, beta, scale=5.0)
    loss.backward()
    return v.grad


@pytest.mark.parametrize("r_value", [0.0, 1.0])
def test_r_one_trains_only_the_positive_and_r_zero_only_the_negative_policy(r_value):
    clean, eps, sigma, noisy, old, velocity = _draw(seed=1)
    r = torch.full((5,), r_value)
    beta = 0.5
    grad = _grad(velocity, old, noisy, clean, sigma, r, beta)
    v = velocity.clone().requires_grad_(True)
    target = eps - clean
    mixed = (1 - beta) * old + beta * v if r_value == 1.0 else (1 + beta) * old - beta * v
    # the adaptive weight is a constant of the gradient (detached)
    diff = (target - mixed).flatten(1)
    weight = diff.abs().mean(1).detach()
    (5.0 * (sigma * (diff**2).mean(1) / weight) / beta).mean().backward()
    torch.testing.assert_close(grad, v.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("beta", [1.0, 0.3, 1e-2, 1e-4])
def test_at_the_old_policy_gradient_is_2r_minus_1_times_flow_matching_for_every_beta(beta):
    # v_θ = v_old: v⁺ = v⁻ = v_old; the 1/β of the loss cancels the β of v^±, so the gradient is β-free:
    # ∂L/∂v_θ = scale/B · (2r − 1) · 2σ(v_old − v) / (N · mean|v − v_old|)
    clean, eps, sigma, noisy, old, _ = _draw(seed=2)
    r = torch.tensor([0.0, 1.0, 0.5, 0.25, 0.8])
    grad = _grad(old.clone(), old, noisy, clean, sigma, r, beta)
    target = eps - clean
    n = target[0].numel()
    mean_abs = (target - old).flatten(1).abs().mean(1)
    factor = 5.0 / 5 * (2 * r - 1) * 2 * sigma / (n * mean_abs)
    expected = factor[:, None, None] * (old - target)
    scale = grad.abs().max().item()
    torch.testing.assert_close(grad, expected, rtol=1e-4, atol=1e-6 * scale)
    # an average sample (r = 1/2) carries no signal (to rounding: v⁺ and v⁻ are rounded separately)
    assert grad[2].abs().max().item() <= 1e-6 * scale


def test_old_velocity_gets_no_gradient():
    clean, _, sigma, noisy, old, velocity = _draw(seed=3)
    old = old.clone().requires_grad_(True)
    loss, _ = nft_policy_loss(velocity.requires_grad_(True), old, noisy, clean, sigma, torch.full((5,), 0.7), 1.0, 5.0)
    loss.backward()
    assert old.grad is None


@pytest.mark.parametrize(
    ("config", "steps", "expected"),
    [
        # the authors' decay_type 1: η = min(0.001·i, 0.5)
        (DiffusionNFTConfig(), 0, 0.0),
        (DiffusionNFTConfig(), 1, 0.001),
        (DiffusionNFTConfig(), 300, 0.3),
        (DiffusionNFTConfig(), 10_000, 0.5),
        # decay_type 2: flat 75 steps, then 0.0075 per step up to 0.999
        (DiffusionNFTConfig(decay_flat_steps=75, decay_rate=0.0075, decay_max=0.999), 74, 0.0),
        (DiffusionNFTConfig(decay_flat_steps=75, decay_rate=0.0075, decay_max=0.999), 175, 0.75),
        (DiffusionNFTConfig(decay_flat_steps=75, decay_rate=0.0075, decay_max=0.999), 1000, 0.999),
    ],
)
def test_old_policy_decay_schedule(config, steps, expected):
    assert DiffusionNFT.old_policy_decay(config, steps) == pytest.approx(expected)


def test_advantage_is_group_centred_and_globally_scaled():
    scores = torch.tensor([1.0, 3.0, 2.0, 2.0, 0.0, 4.0])
    index = ["a", "a", "b", "b", "c", "c"]
    adv = DiffusionNFT.compute_advantage(scores, index, DiffusionNFTConfig())
    centred = torch.tensor([-1.0, 1.0, 0.0, 0.0, -2.0, 2.0])
    # population std (ddof 0), as the authors' numpy stat tracker
    torch.testing.assert_close(adv, centred / (scores.std(unbiased=False) + 1e-4))


def test_replay_steps_are_the_configured_fraction_without_repeats():
    from verl_omni.algorithms.diffusion_nft import DiffusionNFTLoss
    from verl_omni.workers.config.actor import DiffusionActorConfig

    loss = DiffusionNFTLoss(DiffusionActorConfig(), DiffusionNFTConfig())
    steps = loss.replay_steps(10)
    assert len(steps) == 9 and len(set(steps)) == 9 and all(0 <= s < 10 for s in steps)
    assert (
        len(DiffusionNFTLoss(DiffusionActorConfig(), DiffusionNFTConfig(timestep_fraction=0.01)).replay_steps(10)) == 1
    )
    assert loss.required_keys == ("advantages",)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"beta": 0.0}, "algorithm.beta"),
        ({"timestep_fraction": 1.5}, "algorithm.timestep_fraction"),
        ({"decay_max": 1.2}, "algorithm.decay_max"),
        ({"adv_clip_max": -1.0}, "algorithm.adv_clip_max"),
    ],
)
def test_config_names_the_bad_key(kwargs, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        DiffusionNFTConfig(**kwargs)


def test_declarations_no_log_probs_an_ode_record_and_an_old_adapter():
    from verl_omni.workers.config.actor import DiffusionActorConfig

    algorithm = get_algorithm("diffusion_nft")
    phases = algorithm.phases(DiffusionNFTConfig(), DiffusionActorConfig())
    assert algorithm.rollout_record == "ode_samples"
    assert (phases.old_log_prob, phases.reference, phases.old_policy_adapter) == (False, False, True)


def test_hydra_group_gives_the_papers_defaults_and_ode_rollouts_validate(compose):
    from verl_omni.trainer.config.validation import validate_config

    # algorithm=diffusion_nft alone: its node file also sets the ODE rollout without CFG
    configs = validate_config(compose("algorithm=diffusion_nft"))
    assert configs.algorithm == DiffusionNFTConfig()
    assert configs.rollout.sampling_spec().noise_level == 0.0 and configs.rollout.true_cfg_scale == 1.0


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["algorithm=diffusion_nft", "actor_rollout_ref.rollout.noise_level=0.7"],
            "diffusion_nft trains on ODE samples: set actor_rollout_ref.rollout.noise_level=0",
        ),
        (
            [
                "algorithm=diffusion_nft",
                "actor_rollout_ref.rollout.noise_level=0",
                "actor_rollout_ref.rollout.true_cfg_scale=4",
            ],
            "CFG-free: set actor_rollout_ref.rollout.true_cfg_scale",
        ),
        (
            [
                "algorithm=diffusion_nft",
                "actor_rollout_ref.rollout.noise_level=0",
                "actor_rollout_ref.actor.kl_beta=0.01",
            ],
            "actor_rollout_ref.actor.kl_beta must be 0",
        ),
        # an SDE-window algorithm refuses the ODE rollout that DiffusionNFT needs
        (["actor_rollout_ref.rollout.noise_level=0"], "noise_level must be > 0 for algorithm=flow_grpo"),
    ],
)
def test_rollout_settings_the_algorithm_cannot_train_on_are_refused_naming_the_key(compose, overrides, message):
    from verl_omni.trainer.config.validation import validate_config

    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        validate_config(compose(*overrides))


def test_bagel_is_refused_before_ray_naming_algorithm_and_model(compose, tiny_bagel_path):
    import ray

    from verl_omni.trainer.main_flowgrpo import run_flowgrpo

    overrides = ["algorithm=diffusion_nft"]
    with pytest.raises(
        ValueError,
        match=rf"algorithm=diffusion_nft: BagelTrainingAdapter \(actor_rollout_ref\.model\.path={tiny_bagel_path}",
    ):
        run_flowgrpo(compose(*overrides, model=tiny_bagel_path))
    assert not ray.is_initialized()

"""Online Diffusion-DPO (``algorithm=diffusion_dpo``): the update layout, the shared noise, the step loss against a
re-derivation written here, the declarations, and the config from Hydra with its refusals before Ray.

The re-derivation draws ε itself and measures each error against u = ε − x_0 directly, with the policy's and the
reference's velocities; the loss recovers u from (x_σ, x_0, σ) alone, which is what the engine hands it.
"""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict

from verl_omni.algorithms import NOISE_GROUP_KEY, get_algorithm
from verl_omni.algorithms.diffusion_dpo import (
    PREFERENCE_KEY,
    DiffusionDPO,
    DiffusionDPOConfig,
    DiffusionDPOLoss,
    arrange_pairs,
    pair_slots,
)
from verl_omni.workers.utils.replay import ForwardNoisedStep, forward_noise

# 4 prompt groups of 4: a spread group, an all-equal one, two more spread ones
SCORES = torch.tensor([0.1, 0.5, 0.3, 0.2, 0.4, 0.4, 0.4, 0.4, 0.9, 0.1, 0.5, 0.6, 0.0, 1.0, 2.0, 3.0])
GROUPS = [i // 4 for i in range(16)]


def test_best_worst_layout_puts_each_pair_in_adjacent_rows_spread_over_the_batch():
    rows = DiffusionDPO.arrange_update(SCORES, GROUPS, DiffusionDPOConfig())
    # pairs (best, worst) of groups 0, 2, 3; the equal group makes none; 3 pairs spread over 8 row pairs
    assert pair_slots(3, 8).tolist() == [0, 2, 5]
    assert rows.order[[0, 1, 4, 5, 10, 11]].tolist() == [1, 0, 8, 9, 15, 12]
    assert rows.keep.nonzero().flatten().tolist() == [0, 1, 4, 5, 10, 11]
    preference = rows.keys[PREFERENCE_KEY]
    assert preference[[0, 4, 10]].tolist() == [1.0, 1.0, 1.0] and preference[[1, 5, 11]].tolist() == [-1.0] * 3
    assert bool((preference[~rows.keep] == 0).all())
    groups = rows.keys[NOISE_GROUP_KEY]
    assert groups[[0, 4, 10]].tolist() == groups[[1, 5, 11]].tolist() == [0, 1, 2]
    # every row outside a pair draws its own noise
    assert len(set(groups[~rows.keep].tolist()) | {0, 1, 2}) == 16 - 6 + 3
    assert rows.metrics["dpo/pairs"] == 3.0 and rows.metrics["dpo/pairs_dropped"] == 0.0
    assert rows.metrics["dpo/paired_sample_frac"] == pytest.approx(6 / 16)
    assert rows.metrics["dpo/reward_gap_mean"] == pytest.approx((0.4 + 0.8 + 3.0) / 3)


def test_margin_pairs_beyond_the_batch_keep_the_largest_reward_gaps():
    rows = DiffusionDPO.arrange_update(SCORES, GROUPS, DiffusionDPOConfig(pairing="margin", reward_margin=0.15))
    # pairs above 0.15: group 0 has 4, group 2 has 5, group 3 has 6 (15 pairs) for 8 row pairs
    assert rows.metrics["dpo/pairs"] == 8.0 and rows.metrics["dpo/pairs_dropped"] == 7.0
    assert bool(rows.keep.all())
    chosen, rejected = SCORES[rows.order[0::2]], SCORES[rows.order[1::2]]
    gaps = sorted((chosen - rejected).tolist(), reverse=True)
    # group 3's six gaps (3, 2, 2, 1, 1, 1), group 2's 0.8 and 0.5: the 8 largest of the 15
    assert gaps == pytest.approx([3.0, 2.0, 2.0, 1.0, 1.0, 1.0, 0.8, 0.5])


def test_a_batch_without_preferences_trains_no_row():
    rows = arrange_pairs(torch.zeros(0, 2, dtype=torch.long), torch.ones(4, dtype=torch.float64), 4)
    assert not bool(rows.keep.any()) and rows.metrics["dpo/pairs"] == 0.0
    with pytest.raises(ValueError, match="even batch"):
        arrange_pairs(torch.zeros(0, 2, dtype=torch.long), torch.ones(3, dtype=torch.float64), 3)


def test_advantage_is_each_samples_side_of_its_pairs():
    side = DiffusionDPO.compute_advantage(SCORES, GROUPS, DiffusionDPOConfig())
    expected = torch.zeros(16)
    expected[[1, 8, 15]], expected[[0, 9, 12]] = 1.0, -1.0
    torch.testing.assert_close(side, expected)


def test_samples_of_one_noise_group_share_their_noise_and_no_other_does():
    torch.manual_seed(0)
    clean = torch.randn(6, 3, 5)
    batch = TensorDict({NOISE_GROUP_KEY: torch.tensor([4, 4, 9, 9, 11, 12])}, batch_size=[6])
    noise = forward_noise(clean, batch)
    assert torch.equal(noise[0], noise[1]) and torch.equal(noise[2], noise[3])
    assert not torch.equal(noise[0], noise[2]) and not torch.equal(noise[4], noise[5])
    # without the key every sample draws its own
    fresh = forward_noise(clean, TensorDict({}, batch_size=[6]))
    assert not torch.equal(fresh[0], fresh[1])


def _pair_batch(beta_seed=0):
    """Two pairs (rows 0-1, 2-3) noised as the replay does, with each pair's ε and σ, and made-up velocities."""
    g = torch.Generator().manual_seed(beta_seed)
    clean = torch.randn(4, 6, 8, generator=g, dtype=torch.float64)
    eps_pairs = torch.randn(2, 6, 8, generator=g, dtype=torch.float64)
    eps = eps_pairs[[0, 0, 1, 1]]
    sigma = torch.full((4,), 0.6, dtype=torch.float64)
    noisy = 0.4 * clean + 0.6 * eps
    velocity = (eps - clean) + 0.3 * torch.randn(4, 6, 8, generator=g, dtype=torch.float64)
    reference = (eps - clean) + 0.3 * torch.randn(4, 6, 8, generator=g, dtype=torch.float64)
    micro_batch = TensorDict(
        {NOISE_GROUP_KEY: torch.tensor([0, 0, 1, 1]), PREFERENCE_KEY: torch.tensor([1.0, -1.0, 1.0, -1.0])},
        batch_size=[4],
    )
    return clean, eps, sigma, noisy, velocity, reference, micro_batch


@pytest.mark.parametrize("beta", [1.0, 500.0])
def test_step_loss_equals_the_rederivation_and_only_the_policy_gets_gradient(beta):
    clean, eps, sigma, noisy, velocity, reference, micro_batch = _pair_batch()
    policy = velocity.clone().requires_grad_(True)
    ref = reference.clone().requires_grad_(True)
    replayed = ForwardNoisedStep(clean, noisy, sigma, policy, None, ref)
    loss, metrics = DiffusionDPOLoss(None, DiffusionDPOConfig(beta=beta))(replayed, micro_batch, 0)

    def error(v, i):
        return ((v[i] - (eps[i] - clean[i])) ** 2).mean().item()

    expected = 0.0
    for chosen, rejected in ((0, 1), (2, 3)):
        inside = (error(velocity, chosen) - error(reference, chosen)) - (
            error(velocity, rejected) - error(reference, rejected)
        )
        expected += -math.log(1 / (1 + math.exp(beta / 2 * inside))) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-9)
    assert metrics["dpo_loss"] == pytest.approx(expected, rel=1e-9)
    loss.backward()
    assert policy.grad.abs().sum() > 0 and ref.grad is None


def test_rows_that_are_not_whole_pairs_are_refused_naming_the_settings():
    clean, _, sigma, noisy, velocity, reference, micro_batch = _pair_batch()
    loss = DiffusionDPOLoss(None, DiffusionDPOConfig())
    swapped = micro_batch.clone()
    swapped[PREFERENCE_KEY] = torch.tensor([-1.0, 1.0, 1.0, -1.0])
    split = micro_batch.clone()
    split[NOISE_GROUP_KEY] = torch.tensor([0, 1, 1, 1])
    for bad in (swapped, split):
        with pytest.raises(ValueError, match="ppo_micro_batch_size_per_gpu and actor_rollout_ref.actor.shuffle"):
            loss(ForwardNoisedStep(clean, noisy, sigma, velocity, None, reference), bad, 0)
    three = ForwardNoisedStep(clean[:3], noisy[:3], sigma[:3], velocity[:3], None, reference[:3])
    with pytest.raises(ValueError, match="not whole"):
        loss(three, micro_batch[:3], 0)
    with pytest.raises(RuntimeError, match="reference_in_update"):
        loss(ForwardNoisedStep(clean, noisy, sigma, velocity, None), micro_batch, 0)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"beta": 0.0}, "algorithm.beta"),
        ({"pairing": "all"}, "algorithm.pairing"),
        ({"reward_margin": -0.1}, "algorithm.reward_margin"),
        ({"timestep_fraction": 1.5}, "algorithm.timestep_fraction"),
        ({"num_train_steps": 0}, "algorithm.num_train_steps"),
    ],
)
def test_config_names_the_bad_key(kwargs, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        DiffusionDPOConfig(**kwargs)


def test_declarations_an_ode_record_and_the_reference_inside_the_update():
    from verl_omni.workers.config.actor import DiffusionActorConfig

    algorithm = get_algorithm("diffusion_dpo")
    phases = algorithm.phases(DiffusionDPOConfig(), DiffusionActorConfig())
    assert algorithm.rollout_record == "ode_samples" and not algorithm.uses_log_probs
    assert (phases.old_log_prob, phases.reference, phases.old_policy_adapter) == (False, False, False)
    assert phases.reference_in_update
    assert DiffusionDPOLoss(None, DiffusionDPOConfig()).required_keys == (NOISE_GROUP_KEY, PREFERENCE_KEY)


def test_hydra_group_gives_the_defaults_and_an_ode_rollout_that_validates(compose):
    from verl_omni.trainer.config.validation import validate_config

    configs = validate_config(compose("algorithm=diffusion_dpo"))
    assert configs.algorithm == DiffusionDPOConfig()
    assert configs.rollout.sampling_spec().noise_level == 0.0 and configs.rollout.true_cfg_scale == 1.0
    # full fine-tuning too: its reference is the engine's frozen copy of the base transformer
    assert (
        validate_config(compose("algorithm=diffusion_dpo", "actor_rollout_ref.model.lora.rank=0")).model.lora.rank == 0
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["actor_rollout_ref.rollout.noise_level=0.7"], "trains on ODE samples: set actor_rollout_ref.rollout"),
        (["actor_rollout_ref.actor.kl_beta=0.01"], "actor_rollout_ref.actor.kl_beta must be 0"),
        (["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"], "ppo_micro_batch_size_per_gpu must be even"),
        (["actor_rollout_ref.actor.shuffle=true"], "set actor_rollout_ref.actor.shuffle=false"),
        (["algorithm.pairing=all"], "algorithm.pairing must be one of"),
        (["+algorithm.clip_range=0.2"], "algorithm.clip_range is not a key of algorithm 'diffusion_dpo'"),
    ],
)
def test_settings_the_algorithm_cannot_train_on_are_refused_naming_the_key(compose, overrides, message):
    from verl_omni.trainer.config.validation import validate_config

    with pytest.raises(ValueError, match=message.replace(".", r"\.").replace("+", r"\+")):
        validate_config(compose("algorithm=diffusion_dpo", *overrides))

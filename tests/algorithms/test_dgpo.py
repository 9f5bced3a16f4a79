"""DGPO (``algorithm=dgpo``): the update layout by prompt group, the whole-group check, the step loss on a
forward-noised batch against a re-derivation written here, the declarations, and the config from Hydra with its
refusals before Ray.

The re-derivation draws ε itself (one per group) and measures each error against u = ε − x_0 directly; the loss
recovers u from (x_σ, x_0, σ) alone, which is what the engine hands it.
"""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict

from verl_omni.algorithms import NOISE_GROUP_KEY, get_algorithm
from verl_omni.algorithms.dgpo import DGPO, GROUP_SIZE_KEY, DGPOConfig, DGPOLoss
from verl_omni.workers.utils.replay import ForwardNoisedStep

# 3 prompt groups of 4, interleaved as a batch may come: group "b" has equal rewards
SCORES = torch.tensor([0.1, 0.4, 0.9, 0.5, 0.4, 0.1, 0.3, 0.4, 0.2, 0.2, 0.4, 0.8])
GROUPS = ["a", "b", "c"] * 4


def test_layout_puts_each_prompt_group_in_adjacent_rows_with_one_noise_group():
    rows = DGPO.arrange_update(SCORES, GROUPS, DGPOConfig())
    assert rows.order.tolist() == [0, 3, 6, 9, 1, 4, 7, 10, 2, 5, 8, 11]
    assert rows.keys[NOISE_GROUP_KEY].tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert rows.keys[GROUP_SIZE_KEY].tolist() == [4] * 12
    assert bool(rows.keep.all())
    assert rows.metrics == {"dgpo/groups": 3.0, "dgpo/groups_with_preference": 2.0}
    # with drop_zero_std_groups the equal group's rows stay in the batch but are not trained
    dropped = DGPO.arrange_update(SCORES, GROUPS, DGPOConfig(drop_zero_std_groups=True))
    assert dropped.keep.tolist() == [True] * 4 + [False] * 4 + [True] * 4


def _group_batch(seed=0):
    """Two groups of three noised as the replay does (one ε per group, one σ), with made-up velocities."""
    g = torch.Generator().manual_seed(seed)
    clean = torch.randn(6, 5, 4, generator=g, dtype=torch.float64)
    eps = torch.randn(2, 5, 4, generator=g, dtype=torch.float64)[[0, 0, 0, 1, 1, 1]]
    sigma = torch.full((6,), 0.7, dtype=torch.float64)
    noisy = 0.3 * clean + 0.7 * eps
    velocity = (eps - clean) + 0.3 * torch.randn(6, 5, 4, generator=g, dtype=torch.float64)
    reference = (eps - clean) + 0.3 * torch.randn(6, 5, 4, generator=g, dtype=torch.float64)
    advantages = torch.tensor([1.2, -0.2, -1.0, 0.5, 0.5, -1.0], dtype=torch.float64)
    micro_batch = TensorDict(
        {
            "advantages": advantages,
            NOISE_GROUP_KEY: torch.tensor([3, 3, 3, 8, 8, 8]),
            GROUP_SIZE_KEY: torch.tensor([3] * 6),
        },
        batch_size=[6],
    )
    return clean, eps, sigma, noisy, velocity, reference, micro_batch


@pytest.mark.parametrize("kl_coef", [0.0, 0.5])
def test_step_loss_equals_the_rederivation_and_only_the_policy_gets_gradient(kl_coef):
    clean, eps, sigma, noisy, velocity, reference, micro_batch = _group_batch()
    beta = 30.0
    policy = velocity.clone().requires_grad_(True)
    ref = reference.clone().requires_grad_(True)
    replayed = ForwardNoisedStep(clean, noisy, sigma, policy, None, ref)
    loss, metrics = DGPOLoss(None, DGPOConfig(beta=beta, kl_coef=kl_coef))(replayed, micro_batch, 0)

    def error(v, i):
        return ((v[i] - (eps[i] - clean[i])) ** 2).mean().item()

    advantages = micro_batch["advantages"].tolist()
    objective = 0.0
    for members in ((0, 1, 2), (3, 4, 5)):
        s = beta / 3 * sum(advantages[i] * (error(velocity, i) - error(reference, i)) for i in members)
        objective += math.log1p(math.exp(s)) / 2
    kl = sum(((velocity[i] - reference[i]) ** 2).mean().item() for i in range(6)) / 6
    assert metrics["dgpo_loss"] == pytest.approx(objective, rel=1e-9)
    assert metrics["velocity_kl"] == pytest.approx(kl, rel=1e-9)
    assert loss.item() == pytest.approx(objective / beta + kl_coef * kl, rel=1e-9)
    loss.backward()
    assert policy.grad.abs().sum() > 0 and ref.grad is None


def test_a_micro_batch_holding_part_of_a_group_is_refused_naming_the_settings():
    clean, _, sigma, noisy, velocity, reference, micro_batch = _group_batch()
    loss = DGPOLoss(None, DGPOConfig())
    part = ForwardNoisedStep(clean[:4], noisy[:4], sigma[:4], velocity[:4], None, reference[:4])
    with pytest.raises(
        ValueError, match="ppo_micro_batch_size_per_gpu to be a multiple of actor_rollout_ref.rollout.n"
    ):
        loss(part, micro_batch[:4], 0)
    with pytest.raises(RuntimeError, match="reference_in_update"):
        loss(ForwardNoisedStep(clean, noisy, sigma, velocity, None), micro_batch, 0)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"beta": 0.0}, "algorithm.beta"),
        ({"adv_clip_max": -1.0}, "algorithm.adv_clip_max"),
        ({"timestep_fraction": 0.0}, "algorithm.timestep_fraction"),
        ({"num_train_steps": 0}, "algorithm.num_train_steps"),
        ({"kl_coef": -0.1}, "algorithm.kl_coef"),
    ],
)
def test_config_names_the_bad_key(kwargs, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        DGPOConfig(**kwargs)


def test_declarations_an_ode_record_the_reference_inside_the_update_and_the_group_advantage():
    from verl_omni.workers.config.actor import DiffusionActorConfig

    algorithm = get_algorithm("dgpo")
    phases = algorithm.phases(DGPOConfig(), DiffusionActorConfig())
    assert algorithm.rollout_record == "ode_samples" and not algorithm.uses_log_probs
    assert (phases.old_log_prob, phases.reference, phases.old_policy_adapter) == (False, False, False)
    assert phases.reference_in_update
    assert DGPOLoss(None, DGPOConfig()).required_keys == ("advantages", NOISE_GROUP_KEY, GROUP_SIZE_KEY)
    advantages = algorithm.compute_advantage(SCORES, GROUPS, DGPOConfig())
    # group-normalised: each group's advantages sum to 0, so its positive and negative sub-groups weigh the same
    for group in "abc":
        members = [i for i, g in enumerate(GROUPS) if g == group]
        assert advantages[members].sum().item() == pytest.approx(0.0, abs=1e-6)


def test_hydra_group_gives_the_defaults_and_an_ode_rollout_that_validates(compose):
    from verl_omni.trainer.config.validation import validate_config

    configs = validate_config(compose("algorithm=dgpo"))
    assert configs.algorithm == DGPOConfig()
    assert configs.rollout.sampling_spec().noise_level == 0.0 and configs.rollout.true_cfg_scale == 1.0
    assert configs.actor.ppo_micro_batch_size_per_gpu % configs.rollout.n == 0


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["actor_rollout_ref.rollout.noise_level=0.7"], "trains on ODE samples: set actor_rollout_ref.rollout"),
        (["actor_rollout_ref.actor.kl_beta=0.01"], "actor_rollout_ref.actor.kl_beta must be 0"),
        (
            ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"],
            "ppo_micro_batch_size_per_gpu=2 must be a multiple of actor_rollout_ref.rollout.n=4",
        ),
        (["actor_rollout_ref.actor.shuffle=true"], "set actor_rollout_ref.actor.shuffle=false"),
        (["algorithm.beta=0"], "algorithm.beta must be > 0"),
        (["+algorithm.pairing=margin"], "algorithm.pairing is not a key of algorithm 'dgpo'"),
    ],
)
def test_settings_the_algorithm_cannot_train_on_are_refused_naming_the_key(compose, overrides, message):
    from verl_omni.trainer.config.validation import validate_config

    with pytest.raises(ValueError, match=message.replace(".", r"\.").replace("+", r"\+")):
        validate_config(compose("algorithm=dgpo", *overrides))

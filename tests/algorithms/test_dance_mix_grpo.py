"""DanceGRPO's and MixGRPO's algorithm modules: advantage against a re-derivation written here, the trained
steps, and the sampler settings each one refuses to run without (through Hydra's ``algorithm=<name>``)."""

from __future__ import annotations

import statistics

import pytest
import torch

from verl_omni.algorithms import get_algorithm
from verl_omni.algorithms.dance_grpo import DanceGRPOConfig, DanceGRPOLoss, compute_dance_grpo_advantage
from verl_omni.workers.config.actor import DiffusionActorConfig


def reference_advantage(rewards, groups, epsilon, clip):
    """Per group: (r − mean) / (sample std + ε), Python's statistics (ddof 1); lone samples 0; then the clip."""
    out = []
    for r, g in zip(rewards, groups, strict=True):
        members = [x for x, h in zip(rewards, groups, strict=True) if h == g]
        if len(members) < 2:
            out.append(0.0)
            continue
        a = (r - statistics.fmean(members)) / (statistics.stdev(members) + epsilon)
        out.append(max(-clip, min(clip, a)))
    return out


@pytest.mark.parametrize("name", ["dance_grpo", "mix_grpo"])
def test_advantage_is_normalized_per_group_by_its_sample_std(name):
    algorithm = get_algorithm(name)
    config = algorithm.config_cls()
    g = torch.Generator().manual_seed(0)
    rewards = torch.randn(12, generator=g)
    groups = ["a"] * 4 + ["b"] * 4 + ["c"] * 3 + ["d"]  # a lone sample in d
    got = algorithm.compute_advantage(rewards, groups, config)
    want = reference_advantage(rewards.double().tolist(), groups, config.epsilon, config.adv_clip_max)
    torch.testing.assert_close(got.double(), torch.tensor(want, dtype=torch.float64), rtol=1e-6, atol=1e-6)
    assert got[-1] == 0.0


def test_advantage_edges_equal_rewards_give_zero_and_an_outlier_is_clipped():
    equal = compute_dance_grpo_advantage(torch.full((6,), 0.3), ["u"] * 6)
    assert torch.equal(equal, torch.zeros(6))
    # one outlier among 40: (n − 1)/sqrt(n) ≈ 6.2 standard deviations before the clip
    rewards = torch.zeros(40)
    rewards[0] = 1.0
    adv = compute_dance_grpo_advantage(rewards, ["u"] * 40, adv_clip_max=5.0)
    assert adv[0].item() == 5.0
    assert adv[1].item() == pytest.approx(-(1 / 40) / statistics.stdev(rewards.tolist()), rel=1e-5)


def dance_loss(**values) -> DanceGRPOLoss:
    return DanceGRPOLoss(DiffusionActorConfig(), DanceGRPOConfig(**values))


def test_dance_trains_a_random_fraction_of_the_steps_before_the_last():
    loss = dance_loss(timestep_fraction=0.6)
    draws = [loss.replay_steps(16) for _ in range(30)]
    assert all(len(d) == int(15 * 0.6) and len(set(d)) == len(d) for d in draws)
    assert all(0 <= s < 15 for d in draws for s in d)  # the last recorded step (15) is never trained
    assert len({tuple(d) for d in draws}) > 1  # a new draw per update
    assert set().union(*map(set, draws)) == set(range(15))
    again = dance_loss(timestep_fraction=0.6)
    assert [again.replay_steps(16) for _ in range(30)] == draws  # seeded: the same on every rank


def test_dance_step_count_edges():
    assert dance_loss(timestep_fraction=0.1).replay_steps(4) != []  # at least one step
    assert len(dance_loss(timestep_fraction=1.0, ignore_last=False).replay_steps(5)) == 5
    assert dance_loss(ignore_last=False).replay_steps(1) == [0]
    with pytest.raises(ValueError, match=r"algorithm.ignore_last=true leaves no step.*sde_window_size"):
        dance_loss().replay_steps(1)
    with pytest.raises(ValueError, match=r"algorithm.timestep_fraction must be in \(0, 1\]"):
        DanceGRPOConfig(timestep_fraction=0.0)


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    from verl_omni.utils.dataset.t2i_prompts import ensure_tiny_prompts

    return ensure_tiny_prompts(tmp_path_factory.mktemp("prompts"))


@pytest.fixture
def validated(tiny_qwen_image_path, prompts, tmp_path):
    """``validate_config`` of the trainer config composed by Hydra with ``overrides`` (as the command line)."""
    from verl_omni.trainer.config.validation import validate_config
    from verl_omni.utils.config import compose_config

    def build(*overrides: str):
        train, val = prompts
        base = [
            f"actor_rollout_ref.model.path={tiny_qwen_image_path}",
            f"data.train_files={train}",
            f"data.val_files={val}",
            f"trainer.default_local_dir={tmp_path / 'run'}",
        ]
        return validate_config(compose_config("flowgrpo_trainer", base + list(overrides)))

    return build


ROLLOUT = "actor_rollout_ref.rollout"


def test_each_algorithm_sets_its_sampler_and_refuses_one_it_is_not_defined_with(validated):
    # algorithm=<name> alone brings the rollout keys the algorithm needs (its node file is a global package)
    dance = validated("algorithm=dance_grpo")
    assert dance.algorithm == DanceGRPOConfig() and dance.rollout.sampling_spec().sde_type == "dance"
    assert dance.rollout.same_initial_noise
    mix = validated("algorithm=mix_grpo")
    assert mix.rollout.sde_window_schedule == "progressive" and mix.rollout.sde_window_size == 4
    # a command-line key still wins, and a sampler the algorithm is not defined with is refused naming the key
    with pytest.raises(ValueError, match=rf"algorithm=dance_grpo.*set {ROLLOUT}.sde_type=dance"):
        validated("algorithm=dance_grpo", f"{ROLLOUT}.sde_type=sde")
    with pytest.raises(ValueError, match=rf"algorithm=mix_grpo.*set {ROLLOUT}.sde_window_schedule=progressive"):
        validated("algorithm=mix_grpo", f"{ROLLOUT}.sde_window_schedule=random")
    with pytest.raises(ValueError, match=r"sde_window_size=6 covers all num_inference_steps=6"):
        validated("algorithm=mix_grpo", f"{ROLLOUT}.sde_window_size=6")

    flash = [
        "algorithm=mix_grpo",
        f"{ROLLOUT}.sde_window_schedule=progressive",
        f"{ROLLOUT}.sde_window_size=2",
        f"{ROLLOUT}.ode_solver=dpmsolver++",
        f"{ROLLOUT}.ode_post_window_ratio=0.4",
    ]
    mix = validated(*flash)
    assert mix.algorithm.name == "mix_grpo" and mix.rollout.sampling_spec().changes_post_window_ode

"""A scorer in its own environment in a real run: ``brightness_numpy1`` pins numpy 1.26.4, which the trainer's
environment does not have; the default tiny run with it as the reward builds that environment before Ray, scores
in it, and its reward reaches the advantages (one run, 2 steps)."""

from __future__ import annotations

import numpy
import pytest
from trainer_helpers import by_step, run_trainer

from verl_omni.utils.reward_score.environment import CACHE_ENV_VAR

pytestmark = pytest.mark.slow

STEPS = 2


@pytest.fixture(scope="module")
def run(scorer_env_dir, ray_cluster, tiny_qwen_image_path, prompt_files, tmp_path_factory):
    address, env, dashboard = ray_cluster
    env = {**env, CACHE_ENV_VAR: str(scorer_env_dir)}
    records, _ = run_trainer(
        tmp_path_factory.mktemp("own_env") / "run",
        tiny_qwen_image_path,
        prompt_files,
        (address, env, dashboard),
        "reward.diffusion.scorers=[{type: brightness_numpy1}]",
        f"trainer.total_training_steps={STEPS}",
    )
    return by_step(records)


def test_the_own_environment_reward_reaches_the_advantages(run):
    assert numpy.__version__ != "1.26.4"  # the pin conflicts with the trainer's environment
    for step in range(1, STEPS + 1):
        metrics = run[step]
        assert metrics["reward/brightness_numpy1/excluded"] == 0.0, "scored in its environment, never left out"
        # the only scorer, weight 1: its brightness is the score the advantages are computed from
        assert 0.0 < metrics["reward/brightness_numpy1/mean"] < 1.0
        assert metrics["critic/score/mean"] == pytest.approx(metrics["reward/brightness_numpy1/mean"], rel=1e-5)
        assert metrics["critic/advantages/max"] > 0.0 > metrics["critic/advantages/min"]

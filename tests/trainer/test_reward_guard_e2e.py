"""The reward-hacking guard in the default tiny run, trained on brightness computed by a scorer in its own
environment, with a held-out HTTP scorer served here that falls exactly as brightness rises (1 − mean pixel / 255).
One run checks both features (a run costs minutes):

* the guard: ``action=stop`` ends the run with status 3 naming the scorer, a checkpoint of the stopping step and
  the reason in the summary. ``action=warn`` differs only in the driver's branch on the alarm:
  ``tests/trainer/diffusion/test_reward_guard.py`` takes it;
* the own environment: ``brightness_numpy1`` pins numpy 1.26.4, which the trainer's environment does not have; the
  run builds that environment before Ray, scores in it, and its reward reaches the advantages.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy
import pytest

sys.path.insert(0, str(Path(__file__).parent / "diffusion"))
from guard_server import DarknessServer  # noqa: E402
from trainer_helpers import by_step, read_metrics, run_entry_point  # noqa: E402

from verl_omni.utils.exit_codes import EXIT_GUARD_STOP  # noqa: E402
from verl_omni.utils.reward_score.environment import CACHE_ENV_VAR  # noqa: E402

pytestmark = pytest.mark.slow

STEPS = 8


@pytest.fixture(scope="module")
def guarded(tmp_path_factory, tiny_qwen_image_path, prompt_files, ray_cluster, scorer_env_dir):
    """``(run directory, finished process)`` of the run with ``reward.guard.action=stop``."""
    address, env, _ = ray_cluster
    server = DarknessServer()
    out = tmp_path_factory.mktemp("guarded") / "stop"
    try:
        proc = run_entry_point(
            out,
            tiny_qwen_image_path,
            prompt_files,
            f"ray_kwargs.ray_init.address={address}",
            "reward.diffusion.scorers=[{type: brightness_numpy1}]",
            f'reward.guard.scorers=[{{type: http, name: darkness, params: {{url: "{server.url}"}}}}]',
            "reward.guard.max_drop=1e-6",
            "reward.guard.action=stop",
            f"trainer.total_training_steps={STEPS}",
            "trainer.test_freq=1",
            "trainer.save_freq=-1",
            env={**env, CACHE_ENV_VAR: str(scorer_env_dir)},
        )
    finally:
        server.close()
    return out, proc


def test_stop_exits_with_its_status_and_names_the_scorer(guarded):
    out, proc = guarded
    assert proc.returncode == EXIT_GUARD_STOP, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "held-out scorer 'darkness'" in proc.stderr
    steps = by_step(read_metrics(out))
    fired = [s for s, m in steps.items() if m.get("guard/fired") == 1.0]
    assert fired and max(steps) == fired[0] < STEPS
    assert steps[fired[0]]["val/score/mean"] > steps[0]["val/score/mean"]
    assert (out / f"global_step_{fired[0]}").is_dir()
    summary = (out / "summary.txt").read_text()
    assert f"stopped after step {fired[0]}" in summary and "'darkness'" in summary
    # the image statistics beside the held-out scorers, from the first validation on
    assert all(f"guard/stats/{k}" in steps[0] for k in ("brightness", "saturation", "contrast", "entropy"))


def test_the_own_environment_reward_reaches_the_advantages(guarded):
    out, _ = guarded
    assert numpy.__version__ != "1.26.4"  # the pin conflicts with the trainer's environment
    trained = {s: m for s, m in by_step(read_metrics(out)).items() if s > 0}
    assert trained, "no training step logged"
    for step, metrics in trained.items():
        assert metrics["reward/brightness_numpy1/excluded"] == 0.0, f"step {step}: scored in its environment"
        # the only scorer, weight 1: its brightness is the score the advantages are computed from
        assert 0.0 < metrics["reward/brightness_numpy1/mean"] < 1.0
        assert metrics["critic/score/mean"] == pytest.approx(metrics["reward/brightness_numpy1/mean"], rel=1e-5)
        assert metrics["critic/advantages/max"] > 0.0 > metrics["critic/advantages/min"]

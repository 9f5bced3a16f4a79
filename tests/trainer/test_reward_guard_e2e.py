"""The reward-hacking guard in the default tiny run: trained on brightness, with a held-out HTTP scorer served here
that falls exactly as brightness rises (1 − mean pixel / 255). ``action=stop`` ends the run with status 3 naming the
scorer, a checkpoint of the stopping step and the reason in the summary. ``action=warn`` differs only in the
driver's branch on the alarm (one run costs minutes): ``tests/trainer/diffusion/test_reward_guard.py`` takes it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "diffusion"))
from guard_server import DarknessServer  # noqa: E402
from trainer_helpers import by_step, read_metrics, run_entry_point  # noqa: E402

from verl_omni.utils.exit_codes import EXIT_GUARD_STOP  # noqa: E402

pytestmark = pytest.mark.slow

STEPS = 8


@pytest.fixture(scope="module")
def darkness_url():
    server = DarknessServer()
    yield server.url
    server.close()


def _guarded_run(out, model, prompts, cluster, url, action):
    address, env, _ = cluster
    scorer = f'reward.guard.scorers=[{{type: http, name: darkness, params: {{url: "{url}"}}}}]'
    return run_entry_point(
        out,
        model,
        prompts,
        f"ray_kwargs.ray_init.address={address}",
        scorer,
        "reward.guard.max_drop=1e-6",
        f"reward.guard.action={action}",
        f"trainer.total_training_steps={STEPS}",
        "trainer.test_freq=1",
        "trainer.save_freq=-1",
        env=env,
    )


def test_stop_exits_with_its_status_and_names_the_scorer(
    tmp_path, tiny_qwen_image_path, prompt_files, ray_cluster, darkness_url
):
    out = tmp_path / "stop"
    proc = _guarded_run(out, tiny_qwen_image_path, prompt_files, ray_cluster, darkness_url, "stop")
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

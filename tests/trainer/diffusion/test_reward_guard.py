"""The reward-hacking guard's parts: image statistics against images whose values are known, the firing rule with a
held-out scorer served over real HTTP by the test, and the config's errors."""

from __future__ import annotations

import pytest
import torch
from guard_server import DarknessServer

from verl_omni.trainer.diffusion.reward_guard import RewardGuard, image_stats
from verl_omni.trainer.diffusion.summary import summary_text
from verl_omni.utils.exit_codes import EXIT_GUARD_STOP
from verl_omni.workers.config.reward_guard import RewardGuardConfig


def _flat(value: int, n: int = 2, size: int = 8) -> torch.Tensor:
    return torch.full((n, 3, size, size), value, dtype=torch.uint8)


def test_image_stats_of_images_with_known_values():
    white = image_stats(_flat(255))
    assert white == pytest.approx({"brightness": 1.0, "saturation": 0.0, "contrast": 0.0, "entropy": 0.0})
    halves = torch.zeros(1, 3, 8, 8, dtype=torch.uint8)
    halves[..., 4:] = 255
    stats = image_stats(halves)
    assert (stats["brightness"], stats["contrast"], stats["entropy"]) == pytest.approx((0.5, 0.5, 1.0))
    red = torch.zeros(1, 3, 4, 4, dtype=torch.uint8)
    red[:, 0] = 255
    assert image_stats(red)["saturation"] == pytest.approx(1.0)
    assert image_stats(red)["brightness"] == pytest.approx(0.299)
    video = torch.stack([_flat(255, n=1)[0], _flat(0, n=1)[0]])[None]  # one video, a white and a black frame
    assert image_stats(video)["brightness"] == pytest.approx(0.5)


@pytest.fixture
def darkness_url():
    server = DarknessServer()
    yield server.url
    server.close()


def _guard(url: str, max_drop: float) -> RewardGuard:
    scorer = {"type": "http", "name": "darkness", "params": {"url": url}}
    return RewardGuard(RewardGuardConfig(scorers=[scorer], max_drop=max_drop))


def test_fires_when_the_trained_score_rises_and_the_held_out_scorer_falls_past_max_drop(darkness_url):
    guard = _guard(darkness_url, max_drop=0.1)
    prompts = ["a", "b"]
    metrics, alarm = guard.observe(0, _flat(51), prompts, trained_score=0.2)
    assert alarm is None and metrics["guard/darkness/mean"] == pytest.approx(0.8)
    assert metrics["guard/stats/brightness_change"] == 0.0
    # brighter, but the held-out score fell by 0.08 <= max_drop: no alarm
    _, alarm = guard.observe(1, _flat(71), prompts, trained_score=0.28)
    assert alarm is None
    metrics, alarm = guard.observe(2, _flat(102), prompts, trained_score=0.4)
    assert metrics["guard/fired"] == 1.0
    assert metrics["guard/stats/brightness_change"] == pytest.approx(0.2)
    assert (alarm.scorer, alarm.step) == ("darkness", 2)
    assert (alarm.best, alarm.now) == pytest.approx((0.8, 0.6))
    assert "'darkness'" in alarm.reason() and "step 2" in alarm.reason()


def test_a_held_out_fall_without_a_trained_rise_is_no_alarm(darkness_url):
    guard = _guard(darkness_url, max_drop=0.01)
    guard.observe(0, _flat(51), ["a", "b"], trained_score=0.5)
    metrics, alarm = guard.observe(1, _flat(153), ["a", "b"], trained_score=0.5)
    assert alarm is None and metrics["guard/fired"] == 0.0


def test_the_summary_names_the_stop_and_the_exit_status_is_its_own(tmp_path):
    from verl_omni.trainer.diffusion.summary import RunRecord

    text = summary_text(
        tmp_path,
        RunRecord({1: 0.1}, {}),
        5,
        3.0,
        "m",
        None,
        algorithm="Flow-GRPO",
        interrupted=False,
        stop_reason="reward guard: held-out scorer 'x' fell",
    )
    assert "stopped after step 1" in text.splitlines()[0]
    assert "stopped: reward guard: held-out scorer 'x' fell" in text
    assert EXIT_GUARD_STOP not in (0, 1, 2)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"action": "halt"}, "reward.guard.action must be one of"),
        ({"max_drop": 0}, "reward.guard.max_drop must be a number > 0"),
        ({"scorers": [{"type": "brightness", "colour": 1}]}, r"reward.guard.scorers\[0\]: unknown key"),
        ({"scorers": [{"type": "brightness"}, {"type": "brightness"}]}, "used twice"),
    ],
)
def test_bad_guard_config_names_the_key(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RewardGuardConfig(**kwargs)


def test_warn_logs_the_reason_and_the_run_goes_on(caplog):
    """The driver's branch on an alarm under ``action=warn`` (the stop branch runs in ``test_reward_guard_e2e.py``):
    the reason is logged and nothing of the stop path runs. The holder has only what the warn branch may read, so
    a stop path taken by mistake fails on the tracker or the checkpoint it would touch."""
    from types import SimpleNamespace

    from verl_omni.trainer.diffusion.ray_trainer import RayFlowGRPOTrainer
    from verl_omni.trainer.diffusion.reward_guard import GuardAlarm

    alarm = GuardAlarm("darkness", best=0.8, now=0.6, step=2, trained_first=0.2, trained_now=0.4)
    holder = SimpleNamespace(configs=SimpleNamespace(guard=RewardGuardConfig(action="warn")), guard_alarm=alarm)
    with caplog.at_level("WARNING"):
        RayFlowGRPOTrainer._guard_fired(holder, alarm)
    assert holder.guard_alarm is None
    assert f"{alarm.reason()}; going on (reward.guard.action=warn)" in caplog.text

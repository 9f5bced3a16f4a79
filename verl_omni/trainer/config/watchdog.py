"""Dataclass of the ``trainer.watchdog`` node: how long each phase of a run may go without progress.

A phase that waits on Ray workers (an engine that never comes up, a replica that stops answering, a reward
worker stuck on a socket) otherwise blocks the driver with every process asleep and nothing printed. The
watchdog (``verl_omni/trainer/diffusion/watchdog.py``) turns such a stall into an error naming the phase, the
workers it waited on and the key below that sets its limit.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from verl.base_config import BaseConfig


@dataclass
class WatchdogConfig(BaseConfig):
    """Seconds each phase may run without progress before the run fails naming it; 0 turns that phase's limit off.

    The defaults are far above what a healthy phase takes, on the tiny CPU run and on a large model alike: they
    catch a stall, they do not time a slow machine.

    Args:
        engine_start_timeout_s (float): starting the workers (actor ranks loading the model, rollout replicas
            starting their engines, reward and agent-loop workers).
        generation_timeout_s (float): one step's rollout (every prompt group's images).
        reward_timeout_s (float): scoring one step's images.
        update_timeout_s (float): one actor phase: the old policy's or the reference's replay, or the update.
        sync_timeout_s (float): the new weights to every rollout replica.
        checkpoint_timeout_s (float): writing one checkpoint.
        validation_timeout_s (float): one validation pass (its images and their scores).
    """

    engine_start_timeout_s: float = 3600.0
    generation_timeout_s: float = 3600.0
    reward_timeout_s: float = 3600.0
    update_timeout_s: float = 3600.0
    sync_timeout_s: float = 3600.0
    checkpoint_timeout_s: float = 3600.0
    validation_timeout_s: float = 3600.0

    def __post_init__(self):
        for item in fields(self):
            if not item.name.endswith("_timeout_s"):
                continue
            value = getattr(self, item.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(
                    f"trainer.watchdog.{item.name} must be a number of seconds >= 0 (0 turns the limit off), "
                    f"got {value!r}"
                )

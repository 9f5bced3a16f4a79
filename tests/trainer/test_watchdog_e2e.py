"""The progress watchdog in the real driver: a phase over its limit ends the run with an error naming it.

A limit far below what the actor's first phase takes stands in for a stall: the driver is in the same ``ray.get``
on the actor ranks either way, and the watchdog cannot tell the two apart. The run must end (not wait), non-zero,
with the step, the phase, the actor rank and its node, and the key in its error.
"""

import re

import pytest
from trainer_helpers import run_entry_point

pytestmark = pytest.mark.slow

# the driver's error for the phase that overran (PhaseWatchdog)
STALLED = re.compile(r"PhaseStalled: step 1: the (\w+) phase made no progress")


def test_an_actor_phase_over_its_limit_fails_the_run_naming_phase_worker_and_key(
    tmp_path, tiny_qwen_image_path, prompt_files, ray_cluster
):
    address, env, _ = ray_cluster
    proc = run_entry_point(
        tmp_path / "run",
        tiny_qwen_image_path,
        prompt_files,
        f"ray_kwargs.ray_init.address={address}",
        "trainer.val_before_train=false",
        "trainer.total_training_steps=1",
        "trainer.watchdog.update_timeout_s=0.001",
        env=env,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-3000:]
    stalled = STALLED.search(output)
    assert stalled, output[-6000:]
    # an actor phase (the first one the key bounds): generation and reward before it ran unbounded and finished
    assert stalled.group(1) in ("old_log_prob", "update_actor"), stalled.group(0)
    assert "(trainer.watchdog.update_timeout_s=0.001)" in output, output[-6000:]
    assert "It waited on actor rank 0 on node " in output, output[-6000:]

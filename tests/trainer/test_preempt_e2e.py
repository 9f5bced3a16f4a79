"""SIGTERM in the middle of a step of ``python -m verl_omni.trainer.main_flowgrpo`` (the tiny Qwen-Image on CPU, the
session's Ray cluster): the driver checkpoints the last finished step, exits with ``EXIT_PREEMPTED`` and the same
command resumes to the metrics of an uninterrupted run (``trainer/diffusion/preemption.py``).

Three runs of the real entry point: ``uninterrupted`` (2 steps), ``preempted`` (SIGTERM once step 2 started
generating, with no checkpoint of step 1 yet: ``save_freq`` saves only the last step) and its resume.
"""

from __future__ import annotations

import signal
import subprocess

import pytest
from trainer_helpers import by_step, entry_point_command, read_metrics, run_trainer

from verl_omni.trainer.diffusion import run_dir
from verl_omni.utils.exit_codes import EXIT_PREEMPTED

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

STEPS = 2
ARGS = (f"trainer.total_training_steps={STEPS}", f"trainer.save_freq={STEPS}", "trainer.test_freq=-1")
# the progress line the driver logs when step 2's generation starts (RayFlowGRPOTrainer._phase)
STEP_2_STARTED = f"step {STEPS}/{STEPS}: gen"


@pytest.fixture(scope="module")
def uninterrupted(ray_cluster, tiny_qwen_image_path, prompt_files, tmp_path_factory):
    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    records, _ = run_trainer(out, tiny_qwen_image_path, prompt_files, ray_cluster, *ARGS)
    return out, records


@pytest.fixture(scope="module")
def preempted(ray_cluster, tiny_qwen_image_path, prompt_files, tmp_path_factory):
    """The run, SIGTERM sent to its driver when step 2 logged its start; its exit status and output."""
    address, env, _ = ray_cluster
    out = tmp_path_factory.mktemp("preempted") / "run"
    command = entry_point_command(
        out, tiny_qwen_image_path, prompt_files, f"ray_kwargs.ray_init.address={address}", *ARGS
    )
    proc = subprocess.Popen(
        command, cwd=out.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if STEP_2_STARTED in line:
                proc.send_signal(signal.SIGTERM)
                break
        lines.extend(proc.stdout)
        returncode = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    return out, returncode, "".join(lines)


@pytest.fixture(scope="module")
def resumed(preempted, ray_cluster, tiny_qwen_image_path, prompt_files):
    out = preempted[0]
    records, _ = run_trainer(out, tiny_qwen_image_path, prompt_files, ray_cluster, *ARGS)
    return out, records


def test_sigterm_mid_step_checkpoints_the_last_finished_step_and_exits_cleanly(preempted):
    out, returncode, output = preempted
    assert STEP_2_STARTED in output, output[-4000:]
    assert returncode == EXIT_PREEMPTED, output[-6000:]
    assert "SIGTERM received" in output and "step 2 dropped before" in output
    # no C++ stack of Ray's handler, no Python traceback
    assert "Traceback" not in output and "*** SIGTERM" not in output, output[-6000:]
    assert run_dir.complete_steps(out) == [1] and run_dir.read_tracker(out) == 1
    assert not list(out.glob(f"*{run_dir.PARTIAL_SUFFIX}")), "no half-written checkpoint"
    assert not (out / run_dir.LOCK_FILE).exists(), "the run-directory lock is released"
    assert [r["step"] for r in read_metrics(out)] == [0, 1]


def test_the_same_command_resumes_to_the_uninterrupted_runs_metrics(uninterrupted, resumed):
    _, expected_records = uninterrupted
    out, records = resumed
    assert [r["step"] for r in records] == list(range(STEPS + 1))
    expected, got = by_step(expected_records), by_step(records)
    for step in range(1, STEPS + 1):
        compared = [k for k in expected[step] if k.startswith(("critic/", "actor/", "reward/"))]
        assert len(compared) > 5
        assert {k: got[step][k] for k in compared} == {k: expected[step][k] for k in compared}, f"step {step}"
    assert run_dir.complete_steps(out)[-1] == STEPS

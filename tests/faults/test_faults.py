"""Fault injection: each kind of process of the tiny CPU run killed at a random point of step 2, and the driver
preempted, over several seeds.

Each trial runs the tiny three-step run (a checkpoint after every step, validation after step 2), waits for a seeded
phase of step 2 to start
(``step 2/2: <phase>``, the driver's progress line), waits a seeded fraction of a second more and then kills the
target: an actor rank, the rollout replica, the reward worker, the agent-loop worker or the request balancer with
SIGKILL (found by class through Ray's state API, so only this cluster's process is hit), or the driver with SIGKILL
or SIGTERM. It asserts what a user of a cluster needs:

* the run ends within :data:`FAIL_WITHIN_S` of the kill, with an error naming the lost worker (a preempted driver:
  with ``EXIT_PREEMPTED``, a checkpoint of the last finished step written);
* the checkpoint the run directory names as latest is complete (a save cut short stays a ``.partial`` directory);
* the same command resumes from it to the uninterrupted run's metrics of every step, exactly (a preempted step's
  validation is skipped, so its ``val/*`` are not compared).

The suite is not part of CI (marker ``faults``, which ``scripts/test.sh`` deselects unless asked): every trial is
two trainer runs. ``bash scripts/fault_table.sh "0 1 2"`` runs it over three seeds and prints the table that
docs/guide/reliability.md ("Fault injection") shows.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest
from trainer_helpers import by_step, entry_point_command, read_metrics, run_trainer

from verl_omni.trainer.diffusion import run_dir
from verl_omni.utils.exit_codes import EXIT_PREEMPTED

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(1800)]

STEPS = 3
# the step a fault strikes in: every worker is still needed after it (a kill in the last step's checkpoint, after the
# workers' last call, is no fault the run can notice)
STRUCK_STEP = 2
# every phase may stall at most this long (the watchdog's keys) and the run must end this long after the kill: a
# fault the run does not notice shows as an error of the watchdog, a hang as a failed trial
WATCHDOG_S = 180
FAIL_WITHIN_S = WATCHDOG_S + 120
ARGS = (
    f"trainer.total_training_steps={STEPS}",
    "trainer.save_freq=1",
    f"trainer.test_freq={STRUCK_STEP}",
    "trainer.val_before_train=false",
    *(
        f"trainer.watchdog.{key}={WATCHDOG_S}"
        for key in (
            "generation_timeout_s",
            "reward_timeout_s",
            "update_timeout_s",
            "sync_timeout_s",
            "checkpoint_timeout_s",
            "validation_timeout_s",
        )
    ),
)
# a progress line of the driver (RayFlowGRPOTrainer._phase): the phase of the struck step that started
PHASE_LINE = re.compile(rf"step {STRUCK_STEP}/{STEPS}: (\w+)$")
# the trainer's error for a worker that died (WorkerSetup.lost_worker_message)
LOST = re.compile(r"the run lost (.+?) on node")


def fault_seeds() -> list[int]:
    """The seeds each fault is tried with: ``FAULT_SEEDS`` (integers separated by spaces), else ``[0]``."""
    raw = os.environ.get("FAULT_SEEDS", "0")
    try:
        return [int(s) for s in raw.split()]
    except ValueError as e:
        raise pytest.UsageError(f"FAULT_SEEDS={raw!r} must be integers separated by spaces, e.g. '0 1 2'") from e


@dataclass(frozen=True)
class Fault:
    """What is killed: a Ray actor of the run by its class (``target``), or the driver (``target`` None)."""

    target: str | None
    sig: signal.Signals = signal.SIGKILL
    # the name the trainer's error gives the lost worker (``lost_worker_message``)
    named: str | None = None


FAULTS = {
    "actor rank": Fault("DiffusionActorWorker", named="actor rank 0"),
    "rollout replica": Fault("vLLMOmniHttpServer", named="replica 0"),
    "reward worker": Fault("DiffusionRewardLoopWorker", named="reward worker 0"),
    "agent-loop worker": Fault("DiffusionAgentLoopWorker", named="agent-loop worker 0"),
    "request balancer": Fault("OmniRequestLoadBalancer", named="request balancer"),
    "driver SIGKILL": Fault(None),
    "driver SIGTERM": Fault(None, signal.SIGTERM),
}


@dataclass
class Trial:
    """One fault at one point of step 2, and what came of it (a row of the table)."""

    fault: str
    seed: int
    phase: str = ""
    delay_s: float = 0.0
    exit_status: int | None = None
    seconds_to_exit: float | None = None
    error: str = ""
    latest_checkpoint: int | None = None
    steps_lost: int | None = None
    resume_exact: bool | None = None


@pytest.fixture(scope="module")
def uninterrupted(ray_cluster, tiny_qwen_image_path, prompt_files, tmp_path_factory):
    """The run without a fault: its metrics per step, and the phases of step 2 its driver logged (where a fault
    may strike)."""
    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    address, env, _ = ray_cluster
    command = entry_point_command(
        out, tiny_qwen_image_path, prompt_files, f"ray_kwargs.ray_init.address={address}", *ARGS
    )
    proc = subprocess.run(command, cwd=out.parent, env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    phases = []
    for line in (proc.stdout + proc.stderr).splitlines():
        found = PHASE_LINE.search(line)
        if found and found.group(1) not in phases:
            phases.append(found.group(1))
    assert "gen" in phases and "sync" in phases, phases
    return by_step(read_metrics(out)), phases


@pytest.fixture(scope="module")
def table():
    """The trials of this module; printed as the fault table when it ends (``pytest -s`` shows it)."""
    rows: list[Trial] = []
    yield rows
    if rows:
        print("\n" + render(rows))


def render(rows: list[Trial]) -> str:
    """The fault table: one row per fault, its worst case over the seeds tried."""
    lines = [
        "| fault | seeds | phases struck | exit status | seconds to exit (max) | error names | steps lost (max) "
        "| resumes exactly |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for fault in FAULTS:
        trials = [t for t in rows if t.fault == fault]
        if not trials:
            continue
        statuses = sorted({str(t.exit_status) for t in trials})
        exits = [t.seconds_to_exit for t in trials if t.seconds_to_exit is not None]
        lost = [t.steps_lost for t in trials if t.steps_lost is not None]
        exact = sum(bool(t.resume_exact) for t in trials)
        lines.append(
            f"| {fault} | {len(trials)} | {', '.join(sorted({t.phase for t in trials}))} | {', '.join(statuses)} "
            f"| {max(exits):.1f} | {'; '.join(sorted({t.error for t in trials}))} | {max(lost, default='-')} "
            f"| {exact}/{len(trials)} |"
            if exits
            else f"| {fault} | {len(trials)} | - | {', '.join(statuses)} | - | - | - | 0/{len(trials)} |"
        )
    return "\n".join(lines)


def actor_pids(dashboard: str, class_name: str) -> list[int]:
    """PIDs of the cluster's live actors of ``class_name`` (only the running trial has live actors)."""
    from ray.util.state import list_actors

    actors = list_actors(
        address=dashboard, filters=[("class_name", "=", class_name), ("state", "=", "ALIVE")], detail=True
    )
    return sorted(a.pid for a in actors if a.pid)


def strike(fault: Fault, proc: subprocess.Popen, dashboard: str, rng: random.Random) -> None:
    """Kill the fault's target now."""
    if fault.target is None:
        proc.send_signal(fault.sig)
        return
    pids = actor_pids(dashboard, fault.target)
    assert pids, f"no live {fault.target} actor to kill"
    os.kill(rng.choice(pids), fault.sig)


def run_until_struck(trial: Trial, fault: Fault, command, out: Path, env: dict, dashboard: str, phases) -> str:
    """Run ``command``, strike at the trial's phase of step 2, wait for the end; the run's output."""
    rng = random.Random(trial.seed * 1000 + list(FAULTS).index(trial.fault))
    trial.phase = rng.choice(phases)
    trial.delay_s = round(rng.uniform(0.0, 0.5), 2)
    proc = subprocess.Popen(
        command, cwd=out.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines, struck = [], None
    try:
        for line in proc.stdout:
            lines.append(line)
            found = PHASE_LINE.search(line.rstrip())
            if found and found.group(1) == trial.phase:
                time.sleep(trial.delay_s)
                strike(fault, proc, dashboard, rng)
                struck = time.monotonic()
                break
        assert struck is not None, (
            f"the run ended before step {STRUCK_STEP} logged {trial.phase}:\n{''.join(lines)[-4000:]}"
        )
        rest, _ = proc.communicate(timeout=FAIL_WITHIN_S)
        lines.append(rest)
        trial.seconds_to_exit = round(time.monotonic() - struck, 1)
        trial.exit_status = proc.returncode
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return "".join(lines)


def check_checkpoints(trial: Trial, out: Path) -> None:
    """The checkpoint named latest is complete; the steps that finished after it are the steps lost."""
    latest = run_dir.read_tracker(out)
    trial.latest_checkpoint = latest
    if latest is not None:
        problem = run_dir.checkpoint_problem(run_dir.step_dir(out, latest), world_size=1)
        assert problem is None, f"the latest checkpoint, step {latest}, is broken: {problem}"
    finished = [r["step"] for r in read_metrics(out) if r["step"] > 0] if (out / "metrics.jsonl").exists() else []
    trial.steps_lost = max(finished, default=0) - (latest or 0)


@pytest.mark.parametrize("seed", fault_seeds())
@pytest.mark.parametrize("fault_name", list(FAULTS), ids=[name.replace(" ", "_") for name in FAULTS])
def test_a_fault_fails_loudly_keeps_the_checkpoints_whole_and_resumes_exactly(
    fault_name, seed, uninterrupted, table, ray_cluster, tiny_qwen_image_path, prompt_files, tmp_path
):
    expected, phases = uninterrupted
    fault = FAULTS[fault_name]
    trial = Trial(fault_name, seed)
    table.append(trial)
    address, env, dashboard = ray_cluster
    out = tmp_path / "run"
    command = entry_point_command(
        out, tiny_qwen_image_path, prompt_files, f"ray_kwargs.ray_init.address={address}", *ARGS
    )
    output = run_until_struck(trial, fault, command, out, env, dashboard, phases)

    if fault.sig == signal.SIGTERM:
        trial.error = "preempted" if "SIGTERM received" in output else "?"
        assert trial.exit_status == EXIT_PREEMPTED, output[-6000:]
    elif fault.target is None:
        trial.error = "(driver killed)"
        assert trial.exit_status == -signal.SIGKILL
    else:
        lost = LOST.search(output)
        trial.error = lost.group(1) if lost else "?"
        assert trial.exit_status not in (0, None), output[-6000:]
        assert lost and lost.group(1) == fault.named, f"the error does not name {fault.named}:\n{output[-6000:]}"
    check_checkpoints(trial, out)

    records, _ = run_trainer(out, tiny_qwen_image_path, prompt_files, ray_cluster, *ARGS)
    got = by_step(records)
    # a preempted step skips its validation to stop within the grace (docs/guide/reliability.md): its line has no val/*
    preempted = STRUCK_STEP if fault.sig == signal.SIGTERM else None
    compared = {
        step: sorted(
            k
            for k in expected[step]
            if k.startswith(("critic/", "actor/", "reward/")) or (k.startswith("val/") and step != preempted)
        )
        for step in expected
    }
    trial.resume_exact = all(
        step in got and {k: got[step].get(k) for k in keys} == {k: expected[step][k] for k in keys}
        for step, keys in compared.items()
    )
    assert trial.resume_exact, json.dumps(asdict(trial))

"""The run directory: locked, resumed or refused, checkpoints complete or ignored (no trainer, seconds).

Checkpoints here are written by ``RunDir.begin_checkpoint`` / ``commit_checkpoint`` (the trainer's
code) with small stand-in files where the actor's would be; ``tests/trainer/test_flowgrpo_e2e.py``
runs the same checks on directories the real actor wrote.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest

from verl_omni.trainer.config import FlowGRPOTrainerConfig
from verl_omni.trainer.diffusion import run_dir
from verl_omni.trainer.diffusion.run_dir import RunDirError, open_run_dir


def trainer(root, **keys) -> FlowGRPOTrainerConfig:
    return FlowGRPOTrainerConfig(default_local_dir=str(root), nnodes=1, n_gpus_per_node=2, **keys)


def save(run: run_dir.RunDir, step: int, keep: int | None = None, commit: bool = True):
    """A checkpoint laid out as the trainer writes it (two ranks' state files, the LoRA, data.pt)."""
    partial = run.begin_checkpoint(step)
    (partial / "actor" / "lora").mkdir(parents=True)
    (partial / "actor" / "lora" / "pytorch_lora_weights.safetensors").write_bytes(b"lora" * step)
    for rank in range(run.world_size):
        (partial / "actor" / f"engine_state_rank{rank}_of{run.world_size}.pt").write_bytes(b"state")
    (partial / "data.pt").write_bytes(b"data")
    return run.commit_checkpoint(step, keep) if commit else partial


def finished_run(root, steps=3):
    """A run that ended: metrics for steps 0..steps, a checkpoint per step, lock released."""
    run = open_run_dir(trainer(root))
    for step in range(1, steps + 1):
        save(run, step)
    (root / run_dir.METRICS_FILE).write_text(
        "".join(json.dumps({"step": s, "data": {}}) + "\n" for s in range(steps + 1))
    )
    run.lock.release()
    return root


def test_a_new_directory_is_a_new_run_and_locked_until_released(tmp_path):
    root = tmp_path / "run"
    run = open_run_dir(trainer(root))
    assert run.resume_from is None and run.resume_step == 0
    holder = json.loads((root / run_dir.LOCK_FILE).read_text())
    assert holder["pid"] == os.getpid()
    run.lock.release()
    assert not (root / run_dir.LOCK_FILE).exists()


def test_commit_renames_the_partial_marks_it_and_moves_the_tracker_after(tmp_path):
    run = open_run_dir(trainer(tmp_path / "run"))
    partial = save(run, 1, commit=False)
    # before the commit: only the partial exists and the tracker does not name it
    assert partial.name == "global_step_1.partial" and not (run.root / run_dir.TRACKER_FILE).exists()
    assert run_dir.complete_steps(run.root) == []
    final = run.commit_checkpoint(1)
    assert final == run.root / "global_step_1" and not partial.exists()
    assert run_dir.checkpoint_problem(final, world_size=2) is None
    assert (run.root / run_dir.TRACKER_FILE).read_text() == "1"
    run.lock.release()


def test_commit_flushes_every_file_before_marking_and_the_rename_before_the_tracker(tmp_path, monkeypatch):
    """A power loss cannot be caused here, so ``os.fsync`` is wrapped to record what it flushed, in order."""
    run = open_run_dir(trainer(tmp_path / "run"))
    partial = save(run, 1, commit=False)
    written = sorted(str(p) for p in partial.rglob("*") if p.is_file())
    flushed: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        flushed.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    run.commit_checkpoint(1)
    marker = next(i for i, p in enumerate(flushed) if run_dir.COMPLETE_FILE in p)
    assert set(written) <= set(flushed[:marker]), "a file was marked complete before it was flushed"
    root = str(run.root)
    tracker = next(i for i, p in enumerate(flushed) if run_dir.TRACKER_FILE in p)
    assert root in flushed[marker:tracker], "the rename was not flushed before the tracker named the step"
    run.lock.release()


def test_auto_resumes_a_finished_run_from_its_newest_checkpoint(tmp_path):
    root = finished_run(tmp_path / "run")
    run = open_run_dir(trainer(root))
    assert run.resume_from == root / "global_step_3" and run.resume_step == 3
    run.lock.release()


@pytest.mark.parametrize("damage", ["deleted", "partial", "truncated"])
def test_auto_falls_back_to_the_newest_complete_checkpoint_naming_both(tmp_path, caplog, damage):
    root = finished_run(tmp_path / "run")
    latest = root / "global_step_3"
    if damage == "deleted":
        import shutil

        shutil.rmtree(latest)
    elif damage == "partial":
        (latest / run_dir.COMPLETE_FILE).unlink()
    else:
        (latest / "actor" / "lora" / "pytorch_lora_weights.safetensors").write_bytes(b"lo")
    with caplog.at_level(logging.WARNING, logger=run_dir.__name__):
        run = open_run_dir(trainer(root))
    run.lock.release()
    assert run.resume_from == root / "global_step_2"
    assert "global_step_3" in caplog.text and "global_step_2" in caplog.text


def test_a_save_killed_midway_is_ignored_and_replaced_by_the_next_save(tmp_path):
    """A kill during a save leaves ``global_step_<N>.partial`` and the tracker at the previous step."""
    root = finished_run(tmp_path / "run", steps=2)
    run = open_run_dir(trainer(root))
    partial = save(run, 3, commit=False)
    (partial / "data.pt").unlink()
    run.lock.release()
    run = open_run_dir(trainer(root))
    assert run.resume_from == root / "global_step_2"
    save(run, 3)
    assert not partial.exists() and run_dir.complete_steps(root) == [1, 2, 3]
    run.lock.release()


def test_auto_refuses_an_earlier_run_without_a_complete_checkpoint(tmp_path):
    root = tmp_path / "run"
    root.mkdir()
    (root / run_dir.METRICS_FILE).write_text('{"step": 0, "data": {}}\n')
    with pytest.raises(RunDirError, match="no complete checkpoint.*trainer.overwrite_output_dir=true"):
        open_run_dir(trainer(root))
    assert not (root / run_dir.LOCK_FILE).exists(), "a refused run leaves no lock"


def test_an_empty_metrics_file_is_no_earlier_run(tmp_path):
    root = tmp_path / "run"
    root.mkdir()
    (root / run_dir.METRICS_FILE).write_text("")
    open_run_dir(trainer(root, resume_mode="disable")).lock.release()


def test_resume_disabled_over_an_earlier_run_is_refused_with_the_choices_and_changes_nothing(tmp_path):
    root = finished_run(tmp_path / "run")
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    with pytest.raises(RunDirError) as error:
        open_run_dir(trainer(root, resume_mode="disable"))
    for choice in ("trainer.resume_mode=auto", "trainer.default_local_dir", "trainer.overwrite_output_dir=true"):
        assert choice in str(error.value)
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before


def test_overwrite_output_dir_deletes_the_earlier_run_and_nothing_else(tmp_path):
    root = finished_run(tmp_path / "run")
    (root / "images").mkdir()
    (root / "notes.txt").write_text("mine")
    run = open_run_dir(trainer(root, resume_mode="disable", overwrite_output_dir=True))
    assert run.resume_from is None
    assert sorted(p.name for p in root.iterdir()) == ["notes.txt", run_dir.LOCK_FILE]
    run.lock.release()


def test_max_actor_ckpt_to_keep_removes_older_checkpoints_after_a_complete_save(tmp_path):
    run = open_run_dir(trainer(tmp_path / "run"))
    for step in (1, 2, 3):
        save(run, step, keep=2)
    assert sorted(p.name for p in run.root.glob("global_step_*")) == ["global_step_2", "global_step_3"]
    # an unfinished save never costs a complete checkpoint
    save(run, 4, keep=1, commit=False)
    assert run_dir.complete_steps(run.root) == [2, 3]
    run.lock.release()


def test_resume_path_must_exist_be_complete_and_of_this_world_size(tmp_path):
    source = finished_run(tmp_path / "source")
    cases = {
        str(source / "global_step_9"): "does not exist",
        str(source / "global_step_2"): "was written by 2 actor ranks and this run has 4",
    }
    for path, problem in cases.items():
        config = FlowGRPOTrainerConfig(
            default_local_dir=str(tmp_path / "new"),
            n_gpus_per_node=4,
            resume_mode="resume_path",
            resume_from_path=path,
        )
        with pytest.raises(RunDirError, match=f"trainer.resume_from_path={path} {problem}"):
            open_run_dir(config)
    (source / "global_step_1" / run_dir.COMPLETE_FILE).unlink()
    with pytest.raises(RunDirError, match="save did not finish"):
        open_run_dir(
            trainer(tmp_path / "new", resume_mode="resume_path", resume_from_path=str(source / "global_step_1"))
        )
    run = open_run_dir(
        trainer(tmp_path / "new", resume_mode="resume_path", resume_from_path=str(source / "global_step_2"))
    )
    assert run.resume_step == 2
    run.lock.release()


def test_resume_path_older_than_checkpoints_of_the_same_run_is_refused(tmp_path):
    root = finished_run(tmp_path / "run")
    config = trainer(root, resume_mode="resume_path", resume_from_path=str(root / "global_step_1"))
    with pytest.raises(RunDirError, match="older than global_step_2, global_step_3"):
        open_run_dir(config)


# run_dir.py loaded alone: what the driver runs before Ray, without the package's imports (seconds, not minutes)
HOLD_LOCK = """
import importlib.util, pathlib, sys, time
spec = importlib.util.spec_from_file_location("run_dir", sys.argv[1])
run_dir = sys.modules["run_dir"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run_dir)
run_dir.acquire_lock(pathlib.Path(sys.argv[2]))
print("locked", flush=True)
time.sleep(600)
"""


@pytest.fixture
def holder(tmp_path):
    """A live process holding ``tmp_path/run``'s lock (a second run's driver)."""
    root = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, run_dir.__file__, str(root)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "locked"
    yield root, proc
    proc.kill()
    proc.wait()


def test_a_second_live_run_is_refused_naming_the_pid(holder):
    root, proc = holder
    with pytest.raises(RunDirError, match=f"held by pid {proc.pid}, a run that is still writing"):
        open_run_dir(trainer(root))


def test_a_killed_runs_stale_lock_is_taken_over_with_a_warning(holder, caplog):
    root, proc = holder
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (root / run_dir.LOCK_FILE).exists(), "a killed run cannot release its lock"
    with caplog.at_level(logging.WARNING, logger=run_dir.__name__):
        run = open_run_dir(trainer(root))
    assert f"stale lock {root / run_dir.LOCK_FILE} of pid {proc.pid}" in caplog.text
    assert json.loads((root / run_dir.LOCK_FILE).read_text())["pid"] == os.getpid()
    run.lock.release()


def test_a_lock_of_a_reused_pid_is_stale(tmp_path, caplog):
    """Same pid, other start time: the pid was reused by another process after the run died."""
    root = tmp_path / "run"
    root.mkdir()
    me = {"pid": os.getpid(), "host": run_dir.socket.gethostname(), "started": time.time() - 3600 * 24 * 365}
    (root / run_dir.LOCK_FILE).write_text(json.dumps(me))
    with caplog.at_level(logging.WARNING, logger=run_dir.__name__):
        open_run_dir(trainer(root)).lock.release()
    assert "stale lock" in caplog.text


# ---- a checkpoint that cannot be written ----------------------------------------------------------


def test_a_full_disk_refuses_the_save_naming_the_path_and_the_bytes_and_keeps_the_latest(tmp_path, monkeypatch):
    """FAKE (the one fake of this file): a disk cannot be filled safely on a shared machine, so the free space the
    run directory's filesystem reports is set below what the newest complete checkpoint took."""
    run = open_run_dir(trainer(tmp_path / "run"))
    save(run, 1)
    needed = run.bytes_needed()
    real = run_dir.shutil.disk_usage
    monkeypatch.setattr(run_dir.shutil, "disk_usage", lambda p: real(p)._replace(free=needed - 1))
    with pytest.raises(run_dir.CheckpointSaveError) as raised:
        save(run, 2)
    message = str(raised.value)
    assert str(run_dir.partial_dir(run.root, 2)) in message
    assert f"about {needed} bytes" in message and f"{needed - 1} bytes" in message
    assert not run_dir.partial_dir(run.root, 2).exists() and run_dir.complete_steps(run.root) == [1]
    assert (run.root / run_dir.TRACKER_FILE).read_text() == "1"
    run.lock.release()


def test_an_unwritable_checkpoint_directory_is_refused_naming_it():
    """A real unwritable place (procfs refuses a new directory, also to root): the error names the path and says
    how much space is free there."""
    run = run_dir.RunDir(root=run_dir.Path("/proc/verl_omni_run"), world_size=1)
    with pytest.raises(run_dir.CheckpointSaveError) as raised:
        run.begin_checkpoint(3)
    message = str(raised.value)
    assert "/proc/verl_omni_run/global_step_3.partial" in message and "bytes" in message
    assert "trainer.default_local_dir" in message


def test_a_failed_write_removes_the_partial_and_leaves_the_tracker(tmp_path):
    """What the trainer does when a rank's or ``data.pt``'s write raised: nothing of the failed save stays."""
    run = open_run_dir(trainer(tmp_path / "run"))
    save(run, 1)
    partial = save(run, 2, commit=False)
    error = run.save_failed(2, OSError(28, "No space left on device"))
    assert isinstance(error, run_dir.CheckpointSaveError) and "No space left on device" in str(error)
    assert not partial.exists() and run_dir.complete_steps(run.root) == [1]
    assert (run.root / run_dir.TRACKER_FILE).read_text() == "1"
    run.lock.release()

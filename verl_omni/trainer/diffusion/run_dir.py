"""The run directory (``trainer.default_local_dir``): never silently reused, checkpoints that are whole or absent.

Pure filesystem, no torch or engine imports, so that :func:`open_run_dir` runs in the driver
before Ray starts and refuses in a second what would otherwise destroy an earlier run.

Layout of a run directory::

    run.lock                            the live run's pid, host and start time
    metrics.jsonl                       one JSON object per step (tracking.py)
    latest_checkpointed_iteration.txt   verl's tracker: the step of the newest complete checkpoint
    global_step_<N>/                    a complete checkpoint: actor/, data.pt, checkpoint_complete.json
    global_step_<N>.partial/            a save in progress (or cut off by a kill: ignored, replaced)
    images/, tensorboard/

A checkpoint is written under ``global_step_<N>.partial``; when every rank and the dataloader
state are written, the trainer lists its files (with sizes) in ``checkpoint_complete.json``,
renames the directory to ``global_step_<N>`` and only then updates the tracker file. *Complete*
means: the marker exists and every file it lists exists with the listed size. Resuming reads
only complete checkpoints.

A save that cannot be written (a full disk, an unwritable directory) raises
:class:`CheckpointSaveError` naming the path, the bytes free there and the bytes the newest complete
checkpoint took (what the new one needs, about); its ``.partial`` is removed and the tracker and
the earlier checkpoints are left as they were.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import shutil
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

LOCK_FILE = "run.lock"
METRICS_FILE = "metrics.jsonl"
# verl's name (verl/utils/checkpoint/checkpoint_manager.py), kept so its tools read our runs
TRACKER_FILE = "latest_checkpointed_iteration.txt"
COMPLETE_FILE = "checkpoint_complete.json"
STEP_PREFIX = "global_step_"
PARTIAL_SUFFIX = ".partial"
# what trainer.overwrite_output_dir=true deletes (besides global_step_*); other files are left alone
RUN_OUTPUTS = (METRICS_FILE, TRACKER_FILE, "images", "tensorboard")
_STEP_DIR = re.compile(rf"^{STEP_PREFIX}(\d+)$")
_PARTIAL_DIR = re.compile(rf"^{STEP_PREFIX}(\d+){re.escape(PARTIAL_SUFFIX)}$")

CHOICES = (
    "trainer.resume_mode=auto to resume it, a new trainer.default_local_dir, "
    "or trainer.overwrite_output_dir=true to delete it and start over"
)


class RunDirError(ValueError):
    """The run directory cannot be used as configured; the message names the key, the path and the fix."""


class CheckpointSaveError(RuntimeError):
    """A checkpoint could not be written; the message names the path, the bytes needed and free, and the fix."""


# ---- checkpoints ---------------------------------------------------------------------------------


def step_dir(root: Path, step: int) -> Path:
    return root / f"{STEP_PREFIX}{step}"


def partial_dir(root: Path, step: int) -> Path:
    return root / f"{STEP_PREFIX}{step}{PARTIAL_SUFFIX}"


def checkpoint_step(path: Path) -> int:
    """``N`` of a ``global_step_<N>`` directory."""
    match = _STEP_DIR.match(Path(path).name)
    if match is None:
        raise RunDirError(f"{path} is not a {STEP_PREFIX}<N> checkpoint directory")
    return int(match.group(1))


def checkpoint_problem(path: Path, world_size: int | None = None) -> str | None:
    """Why ``path`` is not a complete checkpoint usable by ``world_size`` actor ranks (None: it is)."""
    if not path.is_dir():
        return "does not exist"
    marker = path / COMPLETE_FILE
    if not marker.is_file():
        return f"has no {COMPLETE_FILE}: its save did not finish"
    try:
        info = json.loads(marker.read_text())
        files, written_by = info["files"], int(info["world_size"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"has an unreadable {COMPLETE_FILE} ({e})"
    for name, size in files.items():
        file = path / name
        if not file.is_file():
            return f"lacks {name}, which its {COMPLETE_FILE} lists"
        if file.stat().st_size != size:
            return f"has {name} of {file.stat().st_size} bytes, its {COMPLETE_FILE} says {size} (truncated copy?)"
    if world_size is not None and written_by != world_size:
        return (
            f"was written by {written_by} actor ranks and this run has {world_size} "
            "(trainer.nnodes x trainer.n_gpus_per_node): resume with the same layout"
        )
    return None


def complete_steps(root: Path) -> list[int]:
    """Steps of the complete ``global_step_<N>`` checkpoints in ``root``, ascending."""
    steps = []
    for path in root.glob(f"{STEP_PREFIX}*"):
        match = _STEP_DIR.match(path.name)
        if match and checkpoint_problem(path) is None:
            steps.append(int(match.group(1)))
    return sorted(steps)


def _write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path`` and rename it over ``path``: readers see old or new."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    """Flush a directory's entries (a rename or a new file) to disk: without it a power loss can undo them."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    """Flush every file and directory under ``root`` to disk before it is marked complete.

    The ranks wrote these files through the page cache; a kill cannot lose them, a power loss
    can. Flushing here, once, keeps ``checkpoint_complete.json`` from outliving its files.
    """
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
        elif path.is_dir():
            _fsync_dir(path)
    _fsync_dir(root)


def checkpoint_bytes(path: Path) -> int:
    """The bytes of a complete checkpoint's files, as its ``checkpoint_complete.json`` lists them."""
    return sum(json.loads((path / COMPLETE_FILE).read_text())["files"].values())


def free_bytes(path: Path) -> int:
    """Bytes free to this process on the filesystem of ``path`` (or of its nearest existing parent)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def read_tracker(root: Path) -> int | None:
    """The step in verl's tracker file, or None when there is none."""
    path = root / TRACKER_FILE
    if not path.is_file():
        return None
    text = path.read_text().strip()
    try:
        return int(text)
    except ValueError:
        raise RunDirError(
            f"{path} holds {text!r}, not a step number; delete it to resume from the newest checkpoint"
        ) from None


# ---- the lock ------------------------------------------------------------------------------------


def _process_start_time(pid: int) -> float | None:
    """Start time of a live process on this host (None when none runs with this pid)."""
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None


@dataclass
class RunLock:
    """``run.lock`` held by this process; released at exit (a killed run leaves it: stale, taken over)."""

    path: Path
    owner: dict

    def release(self) -> None:
        try:
            if json.loads(self.path.read_text()) == self.owner:
                self.path.unlink()
        except (OSError, ValueError):
            pass  # gone or replaced: not ours to remove


def _holder_alive(holder: dict) -> bool | None:
    """True/False for a holder on this host; None when it runs on another host (cannot be checked)."""
    if holder.get("host") != socket.gethostname():
        return None
    started = _process_start_time(int(holder["pid"]))
    # a reused pid has another start time
    return started is not None and abs(started - float(holder["started"])) < 1e-3


def acquire_lock(root: Path) -> RunLock:
    """Take ``root/run.lock`` or raise naming the live run that holds it; a dead holder's lock is taken over."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / LOCK_FILE
    owner = {"pid": os.getpid(), "host": socket.gethostname(), "started": _process_start_time(os.getpid())}
    for _ in range(3):
        tmp = path.with_name(f".{LOCK_FILE}.{uuid.uuid4().hex}")
        tmp.write_text(json.dumps(owner))
        try:
            os.link(tmp, path)  # atomic: fails when the lock exists, and the lock is never half-written
        except FileExistsError:
            pass
        else:
            lock = RunLock(path, owner)
            atexit.register(lock.release)
            return lock
        finally:
            tmp.unlink()
        try:
            holder = json.loads(path.read_text())
            alive = _holder_alive(holder)
        except FileNotFoundError:
            continue  # released meanwhile
        except (OSError, ValueError, KeyError, TypeError):
            holder, alive = {"pid": "?", "host": "?"}, False
        if alive is None:
            raise RunDirError(
                f"{path} is held by pid {holder['pid']} on host {holder['host']}: another run writes "
                f"{root}. Wait for it, set a new trainer.default_local_dir, or delete {path} if that run is dead"
            )
        if alive:
            raise RunDirError(
                f"{path} is held by pid {holder['pid']}, a run that is still writing {root}. Wait for it, "
                "stop it, or set a new trainer.default_local_dir"
            )
        logger.warning(
            "taking over the stale lock %s of pid %s on %s (that run is no longer running)",
            path,
            holder["pid"],
            holder["host"],
        )
        path.unlink(missing_ok=True)
    raise RunDirError(f"could not take {path}: other runs keep taking it; set a new trainer.default_local_dir")


# ---- the run -------------------------------------------------------------------------------------


@dataclass
class RunDir:
    """A locked run directory and the checkpoint the run resumes from (None: a new run).

    Args:
        root: ``trainer.default_local_dir``, absolute.
        world_size: actor ranks (``trainer.nnodes x trainer.n_gpus_per_node``); checkpoints record it.
        resume_from: the complete ``global_step_<N>`` to load, or None.
        lock: this run's ``run.lock``.
    """

    root: Path
    world_size: int
    resume_from: Path | None = None
    lock: RunLock | None = field(default=None, repr=False)

    @property
    def resume_step(self) -> int:
        return 0 if self.resume_from is None else checkpoint_step(self.resume_from)

    def begin_checkpoint(self, step: int) -> Path:
        """An empty ``global_step_<step>.partial`` to save into (a kill mid-save leaves only this behind).

        Refused before anything is written when the filesystem has less free space than the newest
        complete checkpoint took.
        """
        partial = partial_dir(self.root, step)
        needed = self.bytes_needed()
        if needed is not None and free_bytes(self.root) < needed:
            raise self._save_error(step, "the filesystem is too full for it")
        try:
            if partial.exists():
                logger.warning("removing %s, an unfinished save of an earlier attempt", partial)
                shutil.rmtree(partial)
            partial.mkdir(parents=True)
        except OSError as e:
            raise self._save_error(step, f"{type(e).__name__}: {e}") from e
        return partial

    def bytes_needed(self) -> int | None:
        """What a new checkpoint needs, about: the newest complete one's size (None: no checkpoint yet)."""
        steps = complete_steps(self.root) if self.root.is_dir() else []
        return checkpoint_bytes(step_dir(self.root, steps[-1])) if steps else None

    def save_failed(self, step: int, error: BaseException) -> CheckpointSaveError:
        """The error to raise when writing step ``step``'s files failed: its ``.partial`` is removed (it is never
        marked complete), the tracker and the earlier checkpoints stay."""
        shutil.rmtree(partial_dir(self.root, step), ignore_errors=True)
        return self._save_error(step, f"{type(error).__name__}: {error}")

    def _save_error(self, step: int, why: str) -> CheckpointSaveError:
        needed = self.bytes_needed()
        need = f"about {needed} bytes (the newest complete checkpoint's size)" if needed is not None else "unknown"
        tracked = read_tracker(self.root) if self.root.is_dir() else None
        return CheckpointSaveError(
            f"the checkpoint of step {step} could not be written to {partial_dir(self.root, step)}: {why}. "
            f"Needed: {need}; free on that filesystem: {free_bytes(self.root)} bytes. Nothing was marked latest "
            f"({TRACKER_FILE}: {tracked}). Free space or make {self.root} writable, lower "
            "trainer.max_actor_ckpt_to_keep, or set trainer.default_local_dir to a larger, writable disk"
        )

    def commit_checkpoint(self, step: int, keep: int | None = None) -> Path:
        """Mark the finished ``.partial`` complete, rename it, then update the tracker and prune to ``keep``.

        Call only after every rank's save returned and ``data.pt`` is written.
        """
        partial, final = partial_dir(self.root, step), step_dir(self.root, step)
        _fsync_tree(partial)
        files = {str(p.relative_to(partial)): p.stat().st_size for p in sorted(partial.rglob("*")) if p.is_file()}
        _write_atomic(
            partial / COMPLETE_FILE, json.dumps({"step": step, "world_size": self.world_size, "files": files})
        )
        if final.exists():
            # only an incomplete one can be here: open_run_dir resumes from the newest complete checkpoint
            logger.warning("replacing %s (%s)", final, checkpoint_problem(final) or "complete")
            shutil.rmtree(final)
        os.replace(partial, final)
        _fsync_dir(self.root)
        _write_atomic(self.root / TRACKER_FILE, str(step))
        self.prune(keep)
        return final

    def prune(self, keep: int | None) -> None:
        """Delete the oldest complete checkpoints beyond ``keep`` (``trainer.max_actor_ckpt_to_keep``)."""
        if keep is None:
            return
        for step in complete_steps(self.root)[:-keep]:
            logger.info("removing %s (trainer.max_actor_ckpt_to_keep=%d)", step_dir(self.root, step), keep)
            shutil.rmtree(step_dir(self.root, step))


def earlier_run(root: Path) -> list[str]:
    """Names in ``root`` that an earlier run wrote (an empty ``metrics.jsonl`` holds nothing to lose)."""
    found = []
    metrics = root / METRICS_FILE
    if metrics.is_file() and metrics.stat().st_size > 0:
        found.append(METRICS_FILE)
    if (root / TRACKER_FILE).is_file():
        found.append(TRACKER_FILE)
    steps = [p.name for p in root.glob(f"{STEP_PREFIX}*") if _STEP_DIR.match(p.name) or _PARTIAL_DIR.match(p.name)]
    return found + sorted(steps, key=lambda name: int(re.findall(r"\d+", name)[0]))


def _summary(names: list[str]) -> str:
    return ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")


def _overwrite(root: Path, found: list[str]) -> None:
    logger.warning("trainer.overwrite_output_dir=true: deleting the earlier run in %s (%s)", root, _summary(found))
    for name in [*RUN_OUTPUTS, *found]:
        path = root / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def _resume_path_target(root: Path, trainer, world_size: int, found: list[str]) -> Path:
    """``trainer.resume_from_path``, checked: complete, this world size, no later run files it would mix with."""
    target = Path(str(trainer.resume_from_path)).expanduser().absolute()
    problem = checkpoint_problem(target, world_size)
    if problem:
        raise RunDirError(
            f"trainer.resume_from_path={target} {problem}; set it to a complete {STEP_PREFIX}<N> directory "
            f"(complete ones have {COMPLETE_FILE})"
        )
    if target.parent != root:
        if found:
            raise RunDirError(
                f"trainer.default_local_dir={root} holds another run ({_summary(found)}) than "
                f"trainer.resume_from_path={target}; set a new trainer.default_local_dir or "
                "trainer.overwrite_output_dir=true to delete that run"
            )
        return target
    later = [s for s in complete_steps(root) if s > checkpoint_step(target)]
    if later:
        raise RunDirError(
            f"trainer.resume_from_path={target} is older than {_summary([step_dir(root, s).name for s in later])} "
            f"in the same run, which resuming would overwrite; move them away or resume with trainer.resume_mode=auto"
        )
    return target


def _auto_target(root: Path, world_size: int, found: list[str]) -> Path | None:
    """The newest complete checkpoint of the earlier run (warning when the tracker names another), or refuse."""
    if not found:
        return None
    steps = complete_steps(root)
    tracked = read_tracker(root)
    if not steps:
        raise RunDirError(
            f"trainer.default_local_dir={root} holds an earlier run ({_summary(found)}) with no complete "
            f"checkpoint to resume from. Choose a new trainer.default_local_dir, or trainer.overwrite_output_dir=true "
            "to delete it and start over"
        )
    target = step_dir(root, steps[-1])
    if tracked is None:
        logger.warning("%s has no %s; resuming from %s, the newest complete checkpoint", root, TRACKER_FILE, target)
    elif tracked != steps[-1]:
        problem = checkpoint_problem(step_dir(root, tracked)) or "is complete"
        logger.warning(
            "%s names %s%d, which %s; resuming from %s, the newest complete checkpoint",
            root / TRACKER_FILE,
            STEP_PREFIX,
            tracked,
            problem,
            target,
        )
    problem = checkpoint_problem(target, world_size)
    if problem:
        raise RunDirError(f"{target} {problem} (trainer.resume_mode=auto in trainer.default_local_dir={root})")
    return target


def open_run_dir(trainer) -> RunDir:
    """Lock ``trainer.default_local_dir`` and decide what the run resumes from; raise rather than mix runs.

    ``trainer`` is the validated ``FlowGRPOTrainerConfig``. An earlier run in the directory is
    resumed (``resume_mode=auto``, from the newest complete checkpoint), deleted
    (``overwrite_output_dir=true``), or the run is refused with these choices.
    """
    root = Path(str(trainer.default_local_dir)).expanduser().absolute()
    world_size = trainer.nnodes * trainer.n_gpus_per_node
    lock = acquire_lock(root)
    try:
        found = earlier_run(root)
        if trainer.overwrite_output_dir and found:
            if trainer.resume_mode == "resume_path":
                inside = Path(str(trainer.resume_from_path)).expanduser().absolute().parent == root
                if inside:
                    raise RunDirError(
                        f"trainer.overwrite_output_dir=true would delete trainer.resume_from_path="
                        f"{trainer.resume_from_path}; drop one of the two"
                    )
            _overwrite(root, found)
            found = []
        if trainer.resume_mode == "resume_path":
            target = _resume_path_target(root, trainer, world_size, found)
        elif trainer.resume_mode == "auto":
            target = _auto_target(root, world_size, found)
        else:
            if found:
                raise RunDirError(
                    f"trainer.default_local_dir={root} holds an earlier run ({_summary(found)}) and "
                    f"trainer.resume_mode={trainer.resume_mode} would overwrite it. Choose: {CHOICES}"
                )
            target = None
    except BaseException:
        lock.release()
        raise
    run = RunDir(root=root, world_size=world_size, resume_from=target, lock=lock)
    logger.info("run directory %s: %s", root, f"resuming from {target}" if target else "a new run")
    return run

"""Scorers that run in their own Python environment, as a child process speaking a byte protocol.

A scorer whose packages pin something the trainer's environment cannot have declares ``requirements`` and a
``script``: a standalone Python file that imports nothing of ``verl_omni`` (it runs where ``verl_omni`` is not
installed). The environment is built from the requirements by :mod:`.environment` (the trainer's preflight
builds it before Ray; here it is a cache hit). On its first batch the scorer starts ``<env>/bin/python <script>``
once and keeps it for every later batch; :meth:`OwnEnvironmentScorer.close` (or interpreter exit) stops it.

Protocol, one request and one answer per batch, over the child's stdin and stdout:

* request: one JSON line ``{"shape": [...], "prompts": [...], "targets": [...]}`` followed by exactly
  ``prod(shape)`` raw bytes, the uint8 images (``[B, 3, H, W]`` or ``[B, F, 3, H, W]``, C order);
* answer: one JSON line ``{"scores": [...]}`` (``B`` floats) or ``{"error": "<message>"}``; a script that
  returns what it read rather than a score answers ``{"texts": [...]}`` (``B`` strings) and its scorer computes
  the scores on this side, with code it shares with other scorers (``paddle_ocr``).

Raw bytes and JSON, not pickle: the two sides may run different numpy and Python versions. The child's
``serve`` loop is ``_env_scripts/scorer_child.py`` (standard library only), which a script imports.

A child that dies (exits, or closes its stdout) is an error naming the scorer and its environment; it is not
restarted, so a crash in the scorer's own packages is never hidden behind a silent retry.
"""

from __future__ import annotations

import atexit
import json
import subprocess
import threading
import weakref
from pathlib import Path
from typing import ClassVar

from verl_omni.utils.reward_score.base import ScoreBatch, ScorerError, ThreadedScorer
from verl_omni.utils.reward_score.environment import ScorerEnvironment, build

# the folder of the child scripts: not a package, so importing this package does not import them
SCRIPTS_DIR = Path(__file__).resolve().parent / "_env_scripts"


class OwnEnvironmentScorer(ThreadedScorer):
    """Base class of a scorer that runs ``script`` under the Python of an environment built from ``requirements``.

    Class attributes:
        requirements: pip requirement strings of the scorer's environment (non-empty).
        script: path of the standalone scoring script (see the module docstring for its protocol).
        overrides: ``uv`` override requirements of the environment (:class:`.environment.ScorerEnvironment`), e.g. to
            leave out a dependency the requirements declare but the script does not use; none by default.

    A scorer whose script needs its params (a model directory) passes them as command-line arguments:
    :meth:`script_args`.
    """

    script: ClassVar[Path]
    overrides: ClassVar[tuple[str, ...]] = ()

    def __init__(self, params=None):
        super().__init__(params)
        if not self.requirements:
            raise TypeError(f"{type(self).__name__} must declare requirements (its environment's packages)")
        self._process: subprocess.Popen | None = None
        self._dead: str | None = None
        self._lock = threading.Lock()
        self._finalizer: weakref.finalize | None = None

    @classmethod
    def environment(cls) -> ScorerEnvironment:
        return ScorerEnvironment(tuple(cls.requirements), overrides=tuple(cls.overrides))

    def script_args(self) -> list[str]:
        """Command-line arguments of the script (none by default)."""
        return []

    def _start(self) -> subprocess.Popen:
        env_path = build(self.environment())
        process = subprocess.Popen(
            [str(env_path / "bin" / "python"), str(self.script), *self.script_args()],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=str(Path(self.script).parent),
        )
        # stopped with this scorer or at interpreter exit, whichever comes first
        self._finalizer = weakref.finalize(self, _stop, process)
        atexit.register(self._finalizer)
        return process

    def _died(self, reason: str) -> ScorerError:
        code = self._process.poll() if self._process is not None else None
        self._dead = (
            f"scorer {type(self).__name__}'s process in its environment {self.environment().path()} {reason}"
            f" (exit code {code}); its stderr is in this worker's log. It is not restarted: fix the scorer."
        )
        return ScorerError(self._dead)

    def score_sync(self, batch: ScoreBatch) -> list[float]:
        return [float(s) for s in self.request(batch)["scores"]]

    def request(self, batch: ScoreBatch) -> dict:
        """Send ``batch`` to the child and return its answer (``{"scores": ...}`` or ``{"texts": ...}``)."""
        images = batch.images.contiguous().numpy()
        header = {"shape": list(images.shape), "prompts": batch.prompts, "targets": batch.targets}
        with self._lock:
            if self._dead is not None:
                raise ScorerError(self._dead)
            if self._process is None:
                self._process = self._start()
            try:
                self._process.stdin.write(json.dumps(header).encode() + b"\n")
                self._process.stdin.write(images.tobytes())
                self._process.stdin.flush()
                line = self._process.stdout.readline()
            except (BrokenPipeError, OSError) as e:
                raise self._died(f"stopped taking input ({e})") from e
            if not line:
                raise self._died("exited")
        answer = json.loads(line)
        if "error" in answer:
            raise ScorerError(f"scorer {type(self).__name__} failed in its environment: {answer['error']}")
        return answer

    def close(self) -> None:
        """Stop the child process (idempotent)."""
        if self._finalizer is not None:
            self._finalizer()


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.stdin.close()  # the child's serve loop ends on end of input
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

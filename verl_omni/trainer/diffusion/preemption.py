"""Preemption: a signal (``trainer.preempt_signals``) asks the driver to checkpoint and stop at the next safe point.

Schedulers announce a preemption with a signal and kill the job a grace period later (SLURM's
``--signal``/``KillWait``, Kubernetes' ``terminationGracePeriodSeconds``). The handler here only
records the request; the step loop acts on it between phases, where the actor's weights, the
dataloader's position and the run directory agree:

* before the actor's phases of a step (``gen``, ``reward``): the step is abandoned and the last
  finished step is checkpointed, unless the step can finish within ``trainer.preempt_grace_s``
  of the signal (estimated from the previous step's time);
* once the actor was asked anything in a step (log-probs, update, sync): the step finishes and is
  checkpointed, since its work cannot be undone.

The driver then releases the run-directory lock, shuts Ray down and exits with
:data:`~verl_omni.utils.exit_codes.EXIT_PREEMPTED`. A second signal exits at once with
:data:`~verl_omni.utils.exit_codes.EXIT_PREEMPT_FORCED`; a save cut off by it stays a ``.partial``
directory, which resuming ignores (:mod:`run_dir`).

The handlers replace Ray's own SIGTERM handler in the driver (installed by ``ray.init``, it turns
SIGTERM into an exit in the middle of whatever runs), so they are installed after Ray started.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Callable

from verl_omni.utils.exit_codes import EXIT_PREEMPT_FORCED

logger = logging.getLogger(__name__)

# the phases a step may be abandoned before: the actor has not been asked anything yet in this step, so its
# weights, optimizer and RNG are still those of the last finished step
ABANDONABLE_PHASES = ("gen", "reward")


class Preempted(Exception):
    """The run stopped on a preemption signal; ``step`` is the step its newest complete checkpoint holds (None:
    nothing was trained, no checkpoint written)."""

    def __init__(self, signame: str, step: int | None):
        self.signame, self.step = signame, step
        where = f"the checkpoint of step {step} is complete" if step is not None else "nothing to checkpoint yet"
        super().__init__(f"stopped on {signame}: {where}; run the same command to resume")


class StepAbandoned(Exception):
    """Raised at a phase boundary: the step in progress is dropped and the last finished one checkpointed."""


def signal_number(name: str) -> int:
    """``SIGTERM`` (or ``TERM``) → its number; an unknown name raises naming ``trainer.preempt_signals``."""
    full = name if name.upper().startswith("SIG") else f"SIG{name}"
    number = getattr(signal.Signals, full.upper(), None)
    if number is None or number in (signal.SIGKILL, signal.SIGSTOP):
        raise ValueError(
            f"trainer.preempt_signals has {name!r}, not a signal this process can catch; use names such as "
            "SIGTERM, SIGINT, SIGUSR1"
        )
    return int(number)


class PreemptionRequest:
    """Whether, when and by which signal the run was asked to stop; decides whether a step may still finish."""

    def __init__(self, grace_s: float = 0.0):
        self.grace_s = grace_s
        self.signame: str | None = None
        self.since: float | None = None
        self._previous: dict[int, object] = {}
        self._on_force: Callable[[], None] | None = None

    @property
    def requested(self) -> bool:
        return self.signame is not None

    def install(self, signals: list[str], on_force: Callable[[], None] | None = None) -> None:
        """Handle ``signals`` in this (the main) thread; ``on_force`` runs before a second signal's exit."""
        self._on_force = on_force
        for name in signals:
            number = signal_number(name)
            self._previous[number] = signal.signal(number, self._handle)

    def restore(self) -> None:
        """Put back the handlers :meth:`install` replaced."""
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()

    def request(self, signame: str) -> None:
        """Record a stop request (what the handler does; callable directly, e.g. by a scheduler hook)."""
        self.signame, self.since = signame, time.monotonic()

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if not self.requested:
            self.request(name)
            logger.warning(
                "%s received: stopping at the next safe point with a checkpoint (trainer.preempt_grace_s=%g); "
                "send it again to exit at once",
                name,
                self.grace_s,
            )
            return
        logger.error("%s received again: exiting now with status %d, no new checkpoint", name, EXIT_PREEMPT_FORCED)
        if self._on_force is not None:
            self._on_force()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(EXIT_PREEMPT_FORCED)

    def abandon_before(self, phase: str, step_elapsed_s: float, last_step_s: float | None) -> bool:
        """Whether the step in progress is dropped before ``phase`` rather than finished.

        Only before an abandonable phase, and only when the step would not finish within the grace:
        its expected rest (the previous step's time minus this step's so far; unknown on the first
        step of a process) must end by ``grace_s`` after the signal.
        """
        if not self.requested or phase not in ABANDONABLE_PHASES:
            return False
        if last_step_s is None:
            return True
        finish_at = time.monotonic() + max(last_step_s - step_elapsed_s, 0.0)
        return finish_at > self.since + self.grace_s

"""The driver's progress watchdog: a phase that does not finish within its limit fails the run, saying which.

The driver spends a run blocked in ``ray.get`` on one worker group after another. When a worker stops answering
(an engine that never comes up, a replica wedged in a collective, a reward worker waiting on a dead socket) that
wait has no end and every process sleeps with nothing printed. :class:`PhaseWatchdog` bounds each phase by its
``trainer.watchdog.<phase>_timeout_s`` and turns an overrun into :class:`PhaseStalled`, naming the phase, the step,
the workers it waited on and the key to raise.

How it interrupts: a ``SIGALRM`` timer (``setitimer``) armed for the phase. Python runs the handler in the main
thread, and Ray's blocking ``get`` polls for signals but gives up its wait only for ``KeyboardInterrupt`` (any
other exception raised by a handler is held until the remote call returns, which a stall never does). So the
handler raises :class:`_Expired` (a ``KeyboardInterrupt``), which Ray passes on as a bare ``KeyboardInterrupt``;
:meth:`PhaseWatchdog.phase` recognises its own expiry and raises :class:`PhaseStalled` in its place. A real Ctrl-C
during a phase stays a ``KeyboardInterrupt``, and a timer that was already set (a test runner's time-out) keeps
its deadline and handler. Off the main thread no signal can be delivered: the phases run
unbounded there, and the watchdog says so once.
"""

from __future__ import annotations

import faulthandler
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from verl_omni.trainer.config.watchdog import WatchdogConfig

logger = logging.getLogger(__name__)

# the trainer's phase names (RayFlowGRPOTrainer._phase, and engine_start around the workers' start) -> the
# trainer.watchdog key that bounds them; phases the driver computes itself (adv) have no Ray wait to bound
PHASE_KEYS = {
    "engine_start": "engine_start_timeout_s",
    "gen": "generation_timeout_s",
    "reward": "reward_timeout_s",
    "old_log_prob": "update_timeout_s",
    "ref": "update_timeout_s",
    "update_actor": "update_timeout_s",
    "sync": "sync_timeout_s",
    "save_checkpoint": "checkpoint_timeout_s",
    "testing": "validation_timeout_s",
}


# the shortest timer armed: a deadline that has passed, or is this close, counts as reached
_SOON_S = 1e-3


class PhaseStalled(RuntimeError):
    """A phase of the run did not finish within its ``trainer.watchdog`` limit."""


class _Expired(KeyboardInterrupt):
    """Raised by the alarm handler: the only exception Ray's blocking ``get`` stops waiting for."""


@dataclass
class _Armed:
    name: str
    step: int | None
    key: str
    limit_s: float
    deadline: float


class PhaseWatchdog:
    """Bounds each phase of the driver by its ``trainer.watchdog`` limit (module docstring).

    ``describe_workers(phase)`` names the workers a phase waits on (with their nodes when known); it is called only
    when the phase overran, so it may be as slow as a lookup.
    """

    def __init__(self, config: WatchdogConfig, describe_workers: Callable[[str], str] | None = None):
        self.config = config
        self.describe_workers = describe_workers
        self._armed: list[_Armed] = []
        self._expired: _Armed | None = None
        # SIGALRM's handler and timer before the outermost phase began, given back when it ends
        self._foreign_handler = signal.SIG_DFL
        self._foreign_deadline: float | None = None
        self._warned_off_main = False

    def limit_s(self, phase: str) -> tuple[str | None, float]:
        """``(key, seconds)`` that bound ``phase``; ``(None, 0)`` for a phase the watchdog does not bound."""
        key = PHASE_KEYS.get(phase)
        return key, float(getattr(self.config, key)) if key else 0.0

    @contextmanager
    def phase(self, name: str, step: int | None = None) -> Iterator[None]:
        """Run the body under ``name``'s limit; raises :class:`PhaseStalled` when it overruns."""
        key, limit_s = self.limit_s(name)
        if not limit_s or not self._can_interrupt():
            yield
            return
        if not self._armed:
            self._take_alarm()
        armed = _Armed(name, step, key, limit_s, time.monotonic() + limit_s)
        self._armed.append(armed)
        self._rearm()
        try:
            yield
        except KeyboardInterrupt as interrupt:
            if self._expired is armed:
                self._expired = None
                raise PhaseStalled(self._message(armed)) from interrupt
            raise
        finally:
            self._armed.remove(armed)
            if self._armed:
                self._rearm()
            else:
                self._give_alarm_back()

    def _take_alarm(self) -> None:
        """Install the handler; a timer someone else set (a test runner's time-out) keeps its deadline."""
        remaining_s, _ = signal.setitimer(signal.ITIMER_REAL, 0)
        self._foreign_handler = signal.signal(signal.SIGALRM, self._on_alarm)
        self._foreign_deadline = time.monotonic() + remaining_s if remaining_s > 0 else None

    def _give_alarm_back(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self._foreign_handler)
        if self._foreign_deadline is not None:
            signal.setitimer(signal.ITIMER_REAL, max(self._foreign_deadline - time.monotonic(), _SOON_S))

    def _rearm(self) -> None:
        """The timer to the nearest deadline: the innermost phases' and the one found when the first began."""
        deadlines = [armed.deadline for armed in self._armed]
        if self._foreign_deadline is not None:
            deadlines.append(self._foreign_deadline)
        if not deadlines:
            return
        # a deadline already passed fires at once (setitimer treats 0 as off)
        signal.setitimer(signal.ITIMER_REAL, max(min(deadlines) - time.monotonic(), _SOON_S))

    def _on_alarm(self, signum, frame) -> None:
        now = time.monotonic() + _SOON_S
        overrun = [armed for armed in self._armed if armed.deadline <= now]
        if overrun:
            self._expired = min(overrun, key=lambda armed: armed.deadline)
            # where the driver waited, for the report (the workers' own stacks: py-spy dump --pid on their hosts)
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            raise _Expired()
        if self._foreign_deadline is not None and self._foreign_deadline <= now:
            self._foreign_deadline = None
            if callable(self._foreign_handler):
                self._foreign_handler(signum, frame)
        self._rearm()

    def _can_interrupt(self) -> bool:
        if threading.current_thread() is threading.main_thread():
            return True
        if not self._warned_off_main:
            self._warned_off_main = True
            logger.warning(
                "the trainer runs outside the main thread: trainer.watchdog cannot interrupt its phases, a stalled "
                "worker will not be reported"
            )
        return False

    def _message(self, armed: _Armed) -> str:
        at_step = f"step {armed.step}: " if armed.step is not None else ""
        waited = self.describe_workers(armed.name) if self.describe_workers else ""
        on = f" It waited on {waited}." if waited else ""
        return (
            f"{at_step}the {armed.name} phase made no progress for {armed.limit_s:g} s "
            f"(trainer.watchdog.{armed.key}={armed.limit_s:g}) and was stopped.{on} A worker that stopped answering "
            "stalls a phase: its log and `py-spy dump --pid <pid>` on its host show where it waits. If the phase is "
            f"only slow on this model or machine, raise trainer.watchdog.{armed.key} (0 turns the limit off). "
            "trainer.resume_mode=auto resumes from the newest complete checkpoint."
        )

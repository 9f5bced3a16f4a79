"""The preemption request (``trainer/diffusion/preemption.py``): which signals it takes, when a preempted step may
still finish, and a second signal's exit. Real signals to a real child process; no trainer (that is the slow
``tests/trainer/test_flowgrpo_e2e.py``)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from verl_omni.trainer.config import FlowGRPOTrainerConfig
from verl_omni.trainer.diffusion.preemption import PreemptionRequest, signal_number
from verl_omni.utils.exit_codes import EXIT_PREEMPT_FORCED, EXIT_PREEMPTED


def test_the_exit_statuses_are_distinct_and_not_a_plain_failure():
    assert EXIT_PREEMPTED == 143 and EXIT_PREEMPT_FORCED == 137
    assert len({EXIT_PREEMPTED, EXIT_PREEMPT_FORCED, 0, 1, 2}) == 5


@pytest.mark.parametrize(("name", "number"), [("SIGTERM", 15), ("TERM", 15), ("sigusr1", 10), ("SIGINT", 2)])
def test_signal_names_with_or_without_the_prefix(name, number):
    assert signal_number(name) == number


@pytest.mark.parametrize("bad", ["SIGKILL", "SIGSTOP", "SIGNOPE"])
def test_a_signal_that_cannot_be_caught_is_refused_naming_the_key(bad):
    with pytest.raises(ValueError, match=r"trainer\.preempt_signals"):
        FlowGRPOTrainerConfig(preempt_signals=[bad])


def test_a_negative_grace_is_refused_naming_the_key():
    with pytest.raises(ValueError, match=r"trainer\.preempt_grace_s"):
        FlowGRPOTrainerConfig(preempt_grace_s=-1.0)


def test_without_a_request_no_step_is_dropped():
    assert not PreemptionRequest(grace_s=0).abandon_before("gen", step_elapsed_s=0.0, last_step_s=None)


@pytest.mark.parametrize("phase", ["old_log_prob", "ref", "adv", "update_actor", "sync", "save_checkpoint"])
def test_once_the_actor_was_asked_the_step_finishes(phase):
    request = PreemptionRequest(grace_s=0)
    request.request("SIGTERM")
    assert not request.abandon_before(phase, step_elapsed_s=0.0, last_step_s=None)


@pytest.mark.parametrize(
    ("grace_s", "last_step_s", "dropped"),
    [
        (0.0, 10.0, True),  # no grace: dropped before its first phase
        (600.0, 10.0, False),  # the step fits in the grace: it finishes
        (5.0, 3600.0, True),  # an hour-long step does not fit in 5 s
        (600.0, None, True),  # no step finished yet in this process: its time is unknown, not waited for
    ],
)
def test_before_the_actor_the_step_finishes_only_within_the_grace(grace_s, last_step_s, dropped):
    request = PreemptionRequest(grace_s=grace_s)
    request.request("SIGTERM")
    assert request.abandon_before("reward", step_elapsed_s=1.0, last_step_s=last_step_s) is dropped


# a process that takes the signals, reports the first and then waits for more
CHILD = """
import sys, time
from verl_omni.trainer.diffusion.preemption import PreemptionRequest
request = PreemptionRequest()
request.install(["SIGTERM", "SIGUSR1"], on_force=lambda: print("released", flush=True))
print("ready", flush=True)
while not request.requested:
    time.sleep(0.01)
print("requested", request.signame, flush=True)
while True:
    time.sleep(0.01)
"""


def test_the_first_signal_is_a_request_and_the_second_exits_at_once_after_on_force():
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        child.send_signal(signal.SIGUSR1)
        assert child.stdout.readline().strip() == "requested SIGUSR1"
        assert child.poll() is None, "the first signal must not end the process"
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=60) == EXIT_PREEMPT_FORCED
        assert child.stdout.readline().strip() == "released"
    finally:
        if child.poll() is None:
            child.kill()


def test_restore_puts_the_previous_handlers_back():
    before = signal.getsignal(signal.SIGUSR1)
    request = PreemptionRequest()
    request.install(["SIGUSR1"])
    assert signal.getsignal(signal.SIGUSR1) != before
    request.restore()
    assert signal.getsignal(signal.SIGUSR1) == before

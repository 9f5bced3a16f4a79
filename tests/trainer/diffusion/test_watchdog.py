"""The driver's progress watchdog: a stalled phase becomes an error naming it, a healthy one leaves no trace.

The stalls are real waits that never end on their own (an event nobody sets, a Ray actor method that waits on
one); the limits are fractions of a second, so a test fails fast when the watchdog does not fire.
"""

import signal
import threading
from contextlib import contextmanager

import pytest

from verl_omni.trainer.config.watchdog import WatchdogConfig
from verl_omni.trainer.diffusion.watchdog import PhaseStalled, PhaseWatchdog

SHORT_S = 0.3


@contextmanager
def alarm_given_back():
    """Whatever owned SIGALRM before a test (pytest-timeout's time-out) owns it after, with its deadline."""
    handler, (remaining_s, _) = signal.getsignal(signal.SIGALRM), signal.getitimer(signal.ITIMER_REAL)
    yield
    assert signal.getsignal(signal.SIGALRM) is handler
    after_s, _ = signal.getitimer(signal.ITIMER_REAL)
    assert (after_s == 0) == (remaining_s == 0)
    assert after_s <= remaining_s


def watchdog(**limits) -> PhaseWatchdog:
    return PhaseWatchdog(WatchdogConfig(**limits), describe_workers=lambda phase: f"replica 0 on node n1 ({phase})")


def test_a_stalled_phase_fails_naming_phase_step_workers_and_key():
    dog = watchdog(generation_timeout_s=SHORT_S)
    with alarm_given_back(), pytest.raises(PhaseStalled) as raised:
        with dog.phase("gen", step=7):
            threading.Event().wait()
    message = str(raised.value)
    assert "step 7: the gen phase made no progress for 0.3 s" in message
    assert "trainer.watchdog.generation_timeout_s=0.3" in message
    assert "replica 0 on node n1 (gen)" in message


def test_an_inner_phase_keeps_the_outer_deadline_and_gives_its_timer_back():
    dog = watchdog(checkpoint_timeout_s=1000.0, validation_timeout_s=2 * SHORT_S)
    with alarm_given_back(), pytest.raises(PhaseStalled, match="step 2: the testing phase made no progress for 0.6 s"):
        with dog.phase("testing", step=2):
            with dog.phase("save_checkpoint", step=2):
                # the inner phase's own limit is longer: the outer deadline is the nearer one
                assert 0 < signal.getitimer(signal.ITIMER_REAL)[0] <= 2 * SHORT_S
            with dog.phase("save_checkpoint", step=2):
                threading.Event().wait()


@pytest.mark.parametrize("phase", ["gen", "adv"])
def test_a_zero_limit_or_an_unbounded_phase_arms_nothing(phase):
    dog, handler = watchdog(generation_timeout_s=0), signal.getsignal(signal.SIGALRM)
    with dog.phase(phase, step=1):
        assert signal.getsignal(signal.SIGALRM) is handler


def test_ctrl_c_in_a_phase_stays_a_keyboard_interrupt():
    dog = watchdog(update_timeout_s=1000.0)
    with alarm_given_back(), pytest.raises(KeyboardInterrupt) as raised:
        with dog.phase("update_actor", step=3):
            raise KeyboardInterrupt
    assert not isinstance(raised.value, PhaseStalled)


def test_off_the_main_thread_the_phase_runs_unbounded():
    dog, seen, handler = watchdog(sync_timeout_s=SHORT_S), [], signal.getsignal(signal.SIGALRM)

    def body():
        with dog.phase("sync", step=1):
            seen.append(signal.getsignal(signal.SIGALRM))

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen == [handler]


@pytest.mark.parametrize("value", [-1, True, "10"])
def test_a_bad_limit_is_refused_naming_the_key(value):
    with pytest.raises(ValueError, match=r"trainer.watchdog.reward_timeout_s must be a number of seconds >= 0"):
        WatchdogConfig(reward_timeout_s=value)


@pytest.mark.slow
def test_a_ray_get_on_a_stalled_worker_is_interrupted(ray_connect):
    """Ray's blocking get gives up its wait only for a KeyboardInterrupt: the watchdog's error still comes out."""
    import ray

    ray_connect()

    @ray.remote(num_cpus=0)
    class Stuck:
        def wait_forever(self):
            threading.Event().wait()

    stuck = Stuck.remote()
    ray.get(stuck.__ray_ready__.remote())
    dog = watchdog(reward_timeout_s=2.0)
    try:
        with pytest.raises(PhaseStalled, match=r"the reward phase .*trainer.watchdog.reward_timeout_s=2"):
            with dog.phase("reward", step=1):
                ray.get(stuck.wait_forever.remote())
    finally:
        ray.kill(stuck)
        ray.shutdown()

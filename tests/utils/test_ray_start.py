"""Bounded restarts of a local Ray node that missed Ray's fixed 30 s start-up wait.

Ray's node timing out during start-up happens only on a machine busy enough at that moment, so it
cannot be caused on demand: these tests replace ``ray.init`` by a fake that raises Ray's own
message (and count the calls). A real start through the same function runs in every test module
that starts Ray (the fixtures call ``init_local_ray``).
"""

from __future__ import annotations

import logging

import pytest

from verl_omni.utils import ray_start

TIMEOUT = Exception(
    "The current node timed out during startup. This could happen because some of the raylet failed to startup "
    "or the GCS has become overloaded."
)


@pytest.fixture
def fake_init(monkeypatch):
    """``ray.init`` failing with Ray's node start-up timeout the first ``failures`` times; returns the call log."""
    import ray

    def install(failures: int, error: Exception = TIMEOUT):
        calls = []

        def init(**kwargs):
            calls.append(kwargs)
            if len(calls) <= failures:
                raise error

        monkeypatch.setattr(ray, "init", init)
        monkeypatch.setattr(ray, "shutdown", lambda: None)
        return calls

    return install


def test_a_node_that_missed_the_wait_is_started_again(fake_init):
    # a handler and level on the module's own logger: imports earlier in the session raise the root logger's level
    warnings = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())
    level = ray_start.logger.level
    ray_start.logger.addHandler(handler)
    ray_start.logger.setLevel(logging.WARNING)
    try:
        calls = fake_init(failures=1)
        ray_start.init_local_ray(num_cpus=2)
    finally:
        ray_start.logger.removeHandler(handler)
        ray_start.logger.setLevel(level)
    assert calls == [{"num_cpus": 2}, {"num_cpus": 2}]
    assert any("attempt 2 of 3" in message for message in warnings)


def test_attempts_are_bounded_and_the_error_says_what_to_do(fake_init):
    calls = fake_init(failures=10)
    with pytest.raises(RuntimeError, match="fixed 30 s, 3 times.*ray_kwargs.ray_init.address"):
        ray_start.init_local_ray(num_cpus=2)
    assert len(calls) == ray_start.NODE_START_ATTEMPTS


def test_other_errors_and_joining_a_cluster_are_not_retried(fake_init):
    calls = fake_init(failures=1, error=ValueError("bad num_cpus"))
    with pytest.raises(ValueError, match="bad num_cpus"):
        ray_start.init_local_ray(num_cpus=-1)
    assert len(calls) == 1
    calls = fake_init(failures=1)
    with pytest.raises(Exception, match="timed out during startup"):
        ray_start.init_local_ray(address="127.0.0.1:1")
    assert len(calls) == 1

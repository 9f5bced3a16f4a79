"""``python -m verl_omni.trainer.main_flowgrpo`` freezes the collector's heap once ``main`` returned, so the
interpreter's exit does not scan it (``freeze_heap_for_exit``; docs/development.md, "Keeping the suite fast")."""

import subprocess
import sys

import pytest

# the entry point as ``python -m`` runs it; ``--cfg job`` prints the composed config and returns from ``main``
SCRIPT = """
import gc, runpy, sys
sys.argv = ["main_flowgrpo", "--cfg", "job"]
runpy.run_module("verl_omni.trainer.main_flowgrpo", run_name="__main__", alter_sys=True)
print("frozen", gc.get_freeze_count())
"""


# both start a fresh interpreter that imports the entry point (verl, torch, Ray's module): the full suite's
@pytest.mark.slow
def test_the_entry_point_freezes_the_heap_after_main_returns():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True).stdout
    assert "trainer:" in out, "main printed no config"
    frozen = int(out.split("frozen ")[-1])
    assert frozen > 1000, f"{frozen} objects frozen"


@pytest.mark.slow
def test_importing_the_entry_point_freezes_nothing():
    """A process that imports the module (tests, a notebook calling ``run_flowgrpo``) keeps its collector."""
    code = "import gc, verl_omni.trainer.main_flowgrpo; print(gc.get_freeze_count())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert int(out.split()[-1]) == 0


def test_a_dead_worker_reported_in_a_phases_own_words_is_found_in_the_cause_chain():
    """The weight sync wraps a dead server's ``ActorDiedError`` in its own error (naming the server index); the entry
    point finds the Ray error under it, to name the lost worker and its node as for any other phase."""
    from ray.exceptions import ActorDiedError, RayActorError

    from verl_omni.trainer.main_flowgrpo import lost_worker_cause

    died = ActorDiedError()
    try:
        try:
            raise died
        except ActorDiedError as e:
            raise RuntimeError("weight sync (load_lora) failed on rollout server 0 of 1 (1 failed)") from e
    except RuntimeError as wrapped:
        assert lost_worker_cause(wrapped, RayActorError) is died
    assert lost_worker_cause(RuntimeError("a bug"), RayActorError) is None
    looped = RuntimeError("a cause chain with a cycle")
    looped.__cause__ = ValueError()
    looped.__cause__.__cause__ = looped
    assert lost_worker_cause(looped, RayActorError) is None

"""The trainer's INFO progress lines survive the imports that silence the root logger.

vLLM's serving routers import ``model_hosting_container_standards``, which raises the root logger
and its handlers to ERROR at import. Import side effects are per process: each case runs in a
fresh interpreter.
"""

import os
import subprocess
import sys

import pytest

# each case is a fresh interpreter importing the entry point and vLLM's serving package: the full suite's
pytestmark = pytest.mark.slow

SCRIPT = """
import logging
logging.basicConfig(level=logging.INFO)
if {keep}:
    from verl_omni.trainer.main_flowgrpo import keep_log_level
    keep_log_level()
import model_hosting_container_standards.sagemaker
print(logging.getLogger().level, logging.getLogger().handlers[0].level)
"""


def _root_levels(keep: bool) -> list[int]:
    # the variable as a user's shell would have it: unset (an in-process trainer run in this session sets it)
    env = {k: v for k, v in os.environ.items() if k != "SAGEMAKER_CONTAINER_LOG_LEVEL"}
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(keep=keep)], capture_output=True, text=True, check=True, env=env
    ).stdout
    return [int(v) for v in out.split()]


def test_the_import_silences_info_without_the_guard():
    """The failure the guard exists for (if this stops failing upstream, the guard can go)."""
    assert _root_levels(keep=False) == [40, 40]


def test_keep_log_level_keeps_info_for_the_trainer():
    assert _root_levels(keep=True) == [20, 20]

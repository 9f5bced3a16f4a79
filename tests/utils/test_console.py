"""Third-party noise is dropped at its source in a fresh interpreter, and ``VERL_OMNI_SHOW_WARNINGS=1``
brings it back (the imports of the trainer, verl's engines and vLLM's CPU platform, as a run does)."""

import os
import re
import subprocess
import sys

import pytest

from verl_omni.utils.console import SHOW_WARNINGS_ENV

pytestmark = pytest.mark.slow

# what the trainer entry does first, then the imports whose warnings a run printed before its first line
SCRIPT = """
from verl_omni.utils.console import quiet_third_party_output
quiet_third_party_output()
import verl.workers.engine
from vllm.platforms import current_platform
current_platform.import_kernels()
from verl_omni.platforms import cpu_platform_enabled
print("CPU_PLATFORM", cpu_platform_enabled())
"""
# one line of each filtered warning
VERL_ENGINES = "engine is not available: ModuleNotFoundError"
VLLM_PLUGIN_LIST = "Available plugins for group vllm.platform_plugins"
# fixed at the source (the CPU platform imports no device kernels): absent either way
VLLM_KERNELS = "Failed to import from vllm._C"


def _console(show: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != SHOW_WARNINGS_ENV}
    if show is not None:
        env[SHOW_WARNINGS_ENV] = show
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=900, check=True
    )
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def quiet_console():
    return _console(None)


@pytest.fixture(scope="module")
def loud_console():
    return _console("1")


def test_a_fresh_interpreter_prints_none_of_the_filtered_warnings(quiet_console):
    assert "CPU_PLATFORM True" in quiet_console
    assert VERL_ENGINES not in quiet_console
    assert VLLM_PLUGIN_LIST not in quiet_console
    assert VLLM_KERNELS not in quiet_console
    assert "Warning" not in quiet_console, quiet_console
    # what is not filtered still prints
    assert "Platform plugin verl_omni_cpu is activated" in quiet_console


def test_show_warnings_restores_the_filtered_warnings(loud_console):
    # each optional verl engine this install lacks, warned about once (how many verl probes is verl's business)
    engines = re.findall(rf"(\w+) {VERL_ENGINES}", loud_console)
    assert engines, loud_console
    assert len(engines) == len(set(engines)), engines
    assert VLLM_PLUGIN_LIST in loud_console
    assert VLLM_KERNELS not in loud_console


def test_an_invalid_show_warnings_value_names_the_variable(monkeypatch):
    from verl_omni.utils import console

    monkeypatch.setenv(SHOW_WARNINGS_ENV, "maybe")
    with pytest.raises(ValueError, match=f"{SHOW_WARNINGS_ENV} must be 1 or 0"):
        console.quiet_third_party_output()

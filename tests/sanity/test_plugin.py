"""verl loads our plugin through its entry point, and every registration in it happened.

verl logs plugin import failures at DEBUG only, so a broken plugin would otherwise go unnoticed.
"""

import importlib.metadata
import subprocess
import sys


def test_verl_plugin_entry_point_is_installed():
    eps = importlib.metadata.entry_points(group="verl.plugins")
    assert "verl_omni.plugin" in {ep.value for ep in eps}


def test_importing_verl_alone_registers_our_algorithms():
    # a fresh interpreter that imports only verl, as a Ray worker would
    code = (
        "import verl, sys\n"
        "from verl_omni.trainer.flowgrpo import core_algos as c\n"
        "assert 'verl_omni.plugin' in sys.modules, 'plugin not loaded by verl'\n"
        "print(c.ADV_ESTIMATORS.names(), c.POLICY_LOSSES.names())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "['flow_grpo'] ['flow_grpo']" in out.stdout

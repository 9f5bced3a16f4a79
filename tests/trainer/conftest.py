"""Fixtures of the trainer tests: prompt files and a two-node local Ray cluster."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

RAY = str(Path(sys.executable).parent / "ray")
REPO = str(Path(__file__).resolve().parents[2])
# logical CPUs of each node: a 2 replicas + 2 ranks run reserves 6 (ranks, replicas, reward and agent-loop workers)
CPUS_PER_NODE = 6


@pytest.fixture(scope="module")
def prompt_files(tmp_path_factory):
    """``(train, val)`` parquet files whose prompts alternate short and long token lengths."""
    from trainer_helpers import write_prompt_files

    return write_prompt_files(tmp_path_factory.mktemp("prompts"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cluster_pids(root: str) -> list[int]:
    """Processes of this cluster only: every Ray process of a node names its temp dir on its command line."""
    import psutil

    pids = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if root in " ".join(proc.info["cmdline"] or []) and proc.pid != os.getpid():
            pids.append(proc.pid)
    return pids


def _stop(root: str) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in _cluster_pids(root):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        time.sleep(3)


@pytest.fixture(scope="module")
def two_node_cluster():
    """``(address, env, dashboard)`` of a head + one worker node on this machine, stopped by PID afterwards.

    Its own port and temp dir, so other Ray clusters on the machine are left alone (no ``ray stop``).
    The head runs a dashboard on a free port: the state API (``list_actors``) is served by it.
    """
    root = tempfile.mkdtemp(prefix="rmn_", dir="/tmp")  # short: Ray's socket paths must stay < 108 chars
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p),
        "RAY_AUTH_MODE": "disabled",
        "RAY_agent_register_timeout_ms": "120000",
    }
    port = _free_port()
    address = f"127.0.0.1:{port}"
    dashboard_port = _free_port()
    common = [f"--num-cpus={CPUS_PER_NODE}", "--disable-usage-stats"]
    head = ["--head", f"--port={port}", f"--temp-dir={root}/head", f"--dashboard-port={dashboard_port}"]
    try:
        subprocess.run([RAY, "start", *head, *common], env=env, check=True, timeout=300)
        subprocess.run(
            [RAY, "start", f"--address={address}", f"--temp-dir={root}/worker", *common],
            env=env,
            check=True,
            timeout=300,
        )
        yield address, env, f"http://127.0.0.1:{dashboard_port}"
    finally:
        _stop(root)
        shutil.rmtree(root, ignore_errors=True)

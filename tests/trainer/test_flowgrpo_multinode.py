"""``main_flowgrpo`` on an existing two-node Ray cluster (``ray_kwargs.ray_init.address``), on one machine.

The test starts its own head (a non-default port, its own temp dir) and a second Ray node
process, runs one training step with the actor's two ranks and two rollout replicas spread over
both nodes, and then stops exactly the processes of that cluster by PID (other Ray clusters on
the machine are left alone: no ``ray stop``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from trainer_helpers import by_step, run_trainer

# a trainer run starts Ray, replicas and the actor: minutes on a busy 2-core machine
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

RAY = str(Path(sys.executable).parent / "ray")
CPUS_PER_NODE = 6


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
def cluster():
    """``(address, env, dashboard)`` of a head + one worker node started here; stopped by PID afterwards.

    The head runs a dashboard on a free port: the state API (``list_actors``) is served by it."""
    root = tempfile.mkdtemp(prefix="rmn_", dir="/tmp")  # short: Ray's socket paths must stay < 108 chars
    repo = str(Path(__file__).resolve().parents[2])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p),
        "RAY_AUTH_MODE": "disabled",
        "RAY_agent_register_timeout_ms": "120000",
    }
    port = _free_port()
    address = f"127.0.0.1:{port}"
    dashboard_port = _free_port()
    common = [f"--num-cpus={CPUS_PER_NODE}", "--disable-usage-stats"]
    try:
        subprocess.run(
            [
                RAY,
                "start",
                "--head",
                f"--port={port}",
                f"--temp-dir={root}/head",
                f"--dashboard-port={dashboard_port}",
                *common,
            ],
            env=env,
            check=True,
            timeout=300,
        )
        subprocess.run(
            [RAY, "start", f"--address={address}", f"--temp-dir={root}/worker", *common],
            env=env,
            check=True,
            timeout=300,
        )
        yield address, env, f"http://127.0.0.1:{dashboard_port}"
    finally:
        _stop(root)


def test_training_step_on_an_existing_two_node_cluster(cluster, tiny_qwen_image_path, prompt_files, tmp_path):
    import ray
    from ray.util.state import list_actors

    address, env, dashboard = cluster
    out = tmp_path / "run"
    records, wall = run_trainer(
        out,
        tiny_qwen_image_path,
        prompt_files,
        f"ray_kwargs.ray_init.address={address}",
        "trainer.total_training_steps=1",
        "trainer.val_before_train=false",
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=1",
        "actor_rollout_ref.rollout.nnodes=2",
        "actor_rollout_ref.rollout.n_gpus_per_node=1",
        env=env,
    )
    print(f"two-node cluster, 1 step: {wall:.0f} s")
    assert by_step(records)[1]["sync/lora_modules_bound_min"] > 0

    ray.init(address=address)
    try:
        actors = list_actors(address=dashboard, detail=True, limit=1000)
        ranks = [a for a in actors if a.class_name == "DiffusionActorWorker"]
        assert len(ranks) == 2
        assert len({a.node_id for a in actors}) == 2, "the run's actors were placed on both nodes"
    finally:
        ray.shutdown()

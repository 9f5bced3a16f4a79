"""Shared fixtures for the reward loop tests: a refusing endpoint and a small Ray cluster."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

REPO_ROOT = str(Path(__file__).resolve().parents[2])


@pytest.fixture
def refusing_url():
    """A loopback port bound but not listening: connections are refused for the whole test."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture(scope="module")
def ray_cluster():
    """A small local Ray cluster whose workers import this checkout's ``verl_omni``."""
    import ray

    pythonpath = os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p)
    from verl_omni.utils.ray_start import init_local_ray

    init_local_ray(num_cpus=4, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": pythonpath}})
    yield ray
    ray.shutdown()

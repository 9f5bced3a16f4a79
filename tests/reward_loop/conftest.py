"""Shared fixtures for the reward loop tests: a refusing endpoint and a small Ray cluster."""

from __future__ import annotations

import socket

import pytest


@pytest.fixture
def refusing_url():
    """A loopback port bound but not listening: connections are refused for the whole test."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"

"""One launch of a two-rank scenario script under ``torch.distributed.run`` (gloo on CPU), shared by the engine tests
whose scenario needs two real FSDP2 ranks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def run_two_ranks(script: Path, *args, timeout: int = 1700, **env: str) -> None:
    """Run ``script args...`` on two ranks (the repository first on ``PYTHONPATH``, ``env`` added) and fail with the
    tail of its output unless it exits 0; the script writes its results where ``args`` tell it."""
    # --standalone: the launcher's store binds a port the OS assigns and the ranks reuse it; a port picked here and
    # bound by the launcher later can be taken in between by another process of a busy machine
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd += [str(script), *map(str, args)]
    full_env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", **env)
    proc = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]

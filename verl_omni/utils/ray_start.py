"""Start a local Ray node on a busy machine, with a bounded number of attempts.

Ray 2.60 waits a fixed 30 s for a new local node to register with its GCS
(``ray/_private/node.py``, ``Node.__init__``: ``raylet_start_wait_time_s = 30``, a local constant;
the ``RAY_raylet_start_wait_time_s`` variable is not read there). On a 2-core machine with other
work beside it the raylet can take longer, and ``ray.init`` raises "The current node timed out
during startup". No setting raises that bound, so a local start that fails this way is started
again, at most :data:`NODE_START_ATTEMPTS` times, after removing what the failed attempt left
running. Remove this when Ray makes the wait configurable.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

NODE_START_ATTEMPTS = 3
# what Ray 2.60 raises when its fixed wait for the local node runs out
NODE_START_TIMEOUT = "timed out during startup"
# a loaded machine can take longer than Ray's 10-15 s to register the node's agents (this one is read)
AGENT_REGISTER_TIMEOUT_MS = "120000"


def _own_processes() -> set[int]:
    import psutil

    return {child.pid for child in psutil.Process().children(recursive=True)}


def _stop_new_processes(before: set[int]) -> None:
    """Kill the processes (GCS, raylet, agents) a failed start left behind; none of them is in ``before``."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        if child.pid not in before:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass


def init_local_ray(**kwargs) -> None:
    """``ray.init(**kwargs)``; a local node that missed Ray's fixed start-up wait is started again (bounded)."""
    import ray

    os.environ.setdefault("RAY_agent_register_timeout_ms", AGENT_REGISTER_TIMEOUT_MS)
    if kwargs.get("address"):  # joining a running cluster starts no node
        ray.init(**kwargs)
        return
    for attempt in range(1, NODE_START_ATTEMPTS + 1):
        before = _own_processes()
        try:
            ray.init(**kwargs)
            return
        except Exception as e:
            if NODE_START_TIMEOUT not in str(e):
                raise
            ray.shutdown()
            _stop_new_processes(before)
            if attempt == NODE_START_ATTEMPTS:
                raise RuntimeError(
                    f"Ray's local node did not register with its GCS within Ray's fixed 30 s, {NODE_START_ATTEMPTS} "
                    "times: the machine is too busy to start Ray; free CPU (other runs, test suites) and start "
                    "again, or start a cluster with `ray start --head` and pass ray_kwargs.ray_init.address"
                ) from e
            logger.warning(
                "Ray's local node did not register within Ray's fixed 30 s (a busy machine); starting it again "
                "(attempt %d of %d)",
                attempt + 1,
                NODE_START_ATTEMPTS,
            )


def actor_location(_actor) -> tuple[str, str]:
    """``(actor id, "node <id> (<ip>)")`` of the calling actor, run in it through ``__ray_call__``.

    It lives in this module, which imports nothing heavy, because Ray pickles the function by reference: every
    worker it runs in imports its module (the request balancer otherwise imports the trainer's, with verl and torch).
    """
    import ray

    context = ray.get_runtime_context()
    return context.get_actor_id(), f"node {context.get_node_id()} ({ray.util.get_node_ip_address()})"

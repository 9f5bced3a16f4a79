"""Pushing the trained LoRA to every rollout replica, in memory, and checking each one bound it.

The actor exports ``(tensors, peft_config)`` (``DiffusionActorWorker.get_lora_params``); every
replica's server loads them as a new in-memory adapter and its probe returns how many modules the
adapter binds. A replica whose adapter binds nothing would keep sampling from the old policy while
every training metric looks healthy, so any failure fails the sync, naming the replica.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch

logger = logging.getLogger(__name__)


async def push_lora_to_replicas(
    servers: Sequence[Any], peft_config: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]
) -> list[int]:
    """Load the adapter on every server (Ray actor handles of ``vLLMOmniHttpServer``); return modules bound per server.

    Raises:
        ValueError: no servers or no tensors were given.
        RuntimeError: a server failed to load or bind the adapter (the message names the server index).
    """
    if not servers:
        raise ValueError("push_lora_to_replicas got no rollout servers: launch the replicas first")
    if not tensors:
        raise ValueError("push_lora_to_replicas got no LoRA tensors: is model.lora.rank > 0?")
    cpu_tensors = {name: t.detach().to("cpu") for name, t in tensors.items()}
    calls = [server.load_lora_tensors.remote(dict(peft_config), cpu_tensors) for server in servers]
    results = await asyncio.gather(*calls, return_exceptions=True)
    failed = [(i, r) for i, r in enumerate(results) if isinstance(r, BaseException)]
    if failed:
        index, error = failed[0]
        raise RuntimeError(
            f"LoRA sync failed on rollout server {index} of {len(servers)} ({len(failed)} failed): {error}"
        ) from error
    logger.info("LoRA synced to %d rollout servers; modules bound per server: %s", len(servers), results)
    return list(results)

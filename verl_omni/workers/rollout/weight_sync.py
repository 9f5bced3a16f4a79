"""Pushing the trained weights to every rollout replica, in memory, and checking each one took them.

LoRA: the actor exports ``(tensors, peft_config)`` (``DiffusionActorWorker.get_lora_params``); every
replica's server loads them as a new in-memory adapter and its probe returns how many modules the
adapter binds. A replica whose adapter binds nothing would keep sampling from the old policy while
every training metric looks healthy, so any failure fails the sync, naming the replica.

Full fine-tuning: the transformer travels in size-bounded, checksummed buckets
(:mod:`~verl_omni.workers.rollout.weight_buckets`). The actor ranks gather one bucket at a time; rank 0's
bucket goes from its Ray object store entry straight to every server (shared memory on a node; the trainer
process holds only the reference), at most two buckets in flight. Each server checks and loads it in its
workers, and closing the sync checks that no bucket was lost and every transformer parameter was written.
That is the host transport. Colocated on a GPU (``shared``), the LoRA or each bucket stays on the actor ranks'
GPUs and only CUDA IPC handles travel (:mod:`~verl_omni.workers.rollout.device_share`), under the same
checks; NCCL between separate pools is not built (``docs/actor.md``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import ray
import torch

from verl_omni.workers.rollout.weight_buckets import WeightBucket

logger = logging.getLogger(__name__)


async def push_lora_to_replicas(
    servers: Sequence[Any],
    peft_config: Mapping[str, Any],
    tensors: Mapping[str, torch.Tensor] | None = None,
    shared: Sequence[Any] | None = None,
) -> list[int]:
    """Load the adapter on every server (Ray actor handles of ``vLLMOmniHttpServer``); return modules bound per server.

    The adapter is host ``tensors``, or ``shared``: every actor rank's CUDA IPC handle of it (colocated,
    ``DiffusionActorWorker.share_lora_params``), of which each rollout worker opens the one on its GPU.

    Raises:
        ValueError: no servers or no tensors were given.
        RuntimeError: a server failed to load or bind the adapter (the message names the server index).
    """
    if not servers:
        raise ValueError("push_lora_to_replicas got no rollout servers: launch the replicas first")
    if not tensors and not shared:
        raise ValueError("push_lora_to_replicas got no LoRA tensors: is model.lora.rank > 0?")
    if shared:
        calls = [server.load_lora_tensors.remote(dict(peft_config), shared=list(shared)) for server in servers]
    else:
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


async def push_full_weights(
    actor_wg: Any, servers: Sequence[Any], version: int, bucket_bytes: int, ema: bool = False, shared: bool = False
) -> dict[str, float]:
    """One checked full-weight sync from the actor worker group (``DiffusionActorWorker``) to every server; ``ema``:
    the EMA of the weights (``actor.ema_decay``) instead of the live ones, the same names and checks; ``shared``:
    the buckets stay on the actor ranks' GPUs and travel as CUDA IPC handles (colocated, ``device_share``).

    Returns the ``sync/*`` metrics: buckets, megabytes, transformer parameters written per server (the least),
    seconds. Raises ``WeightSyncError`` (a bucket corrupted, lost or unloaded) naming the server.
    """
    if not servers:
        raise ValueError("push_full_weights got no rollout servers: launch the replicas first")
    start = time.perf_counter()
    plan = actor_wg.weight_bucket_plan(bucket_bytes)[0]
    await _on_all(servers, "begin_weight_sync", version, len(plan))

    def gather(index: int):
        refs = actor_wg.get_weight_bucket(plan, version, index, ema, shared)
        # host buckets: rank 0's object reference goes to the servers as it is; shared: every rank's handle
        return WeightBucket.merged(ray.get(list(refs))) if shared else refs[0]

    try:
        pending = gather(0)
        for index in range(len(plan)):
            bucket = pending
            # the next bucket is gathered while the servers load this one
            pending = gather(index + 1) if index + 1 < len(plan) else None
            await _on_all(servers, "load_weight_bucket", bucket)
        reports = await _on_all(servers, "finish_weight_sync", version)
    finally:
        if shared:
            actor_wg.release_shared()
    seconds = time.perf_counter() - start
    logger.info(
        "full weights synced to %d servers in %d buckets (%.1f s): %s", len(servers), len(plan), seconds, reports
    )
    return {
        "sync/full_weight_buckets": float(len(plan)),
        "sync/full_weight_megabytes": reports[0]["bytes"] / 2**20,
        "sync/full_weight_params_written_min": float(min(report["params"] for report in reports)),
        "sync/full_weight_seconds": seconds,
    }


async def _on_all(servers: Sequence[Any], method: str, *args) -> list[Any]:
    """``method(*args)`` on every server at once; the first failure raised, naming the server."""
    results = await asyncio.gather(*[getattr(s, method).remote(*args) for s in servers], return_exceptions=True)
    failed = [(i, r) for i, r in enumerate(results) if isinstance(r, BaseException)]
    if failed:
        index, error = failed[0]
        raise RuntimeError(
            f"full-weight sync ({method}) failed on rollout server {index} of {len(servers)} ({len(failed)} failed): "
            f"{error}"
        ) from error
    return list(results)

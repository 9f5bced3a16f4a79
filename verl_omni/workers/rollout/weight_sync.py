"""Pushing the trained weights to every rollout replica, in memory, and checking each one took them.

LoRA: the actor exports ``(tensors, peft_config)`` (``DiffusionActorWorker.get_lora_params``); every
replica's server loads them as a new in-memory adapter and its probe returns how many modules the
adapter binds. A replica whose adapter binds nothing would keep sampling from the old policy while
every training metric looks healthy, so any failure fails the sync, naming the replica.

A LoRA merged for the rollout (``model.lora.merge``): the adapted linears' ``W + scaling · B @ A`` travel as
full fine-tuning's buckets do, and the rollout serves no adapter (``workers/engine/fsdp/lora_merge.py``).

Full fine-tuning: the transformer travels in size-bounded, checksummed buckets
(:mod:`~verl_omni.workers.rollout.weight_buckets`). The actor ranks gather one bucket at a time, at most two
in flight (the next is gathered while the servers load one); each server checks and loads it in its workers,
and closing the sync checks that no bucket was lost and every transformer parameter was written.

Three transports carry the LoRA or a bucket, chosen in one place (``rollout.weight_transport``,
:func:`~verl_omni.workers.config.rollout.weight_transport_for`), under the same checks:

* ``host`` (CPU): rank 0's bucket goes from its Ray object store entry straight to every server (shared memory
  on a node; the trainer process holds only the reference);
* ``ipc`` (colocated on CUDA): it stays on the actor ranks' GPUs and only CUDA IPC handles travel
  (:mod:`~verl_omni.workers.rollout.device_share`);
* ``collective`` (separate pools on CUDA): actor rank 0 broadcasts it over NCCL to every rollout worker of every
  replica, through a process group made at the first sync (:func:`connect_weight_group`,
  :mod:`~verl_omni.workers.rollout.collective_share`); only its layout and checksum travel through Ray. The
  sender's call and the servers' calls are in flight together: a broadcast completes only once all have joined.
  On the CPU the same path runs over gloo (the tests).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import ray
import torch

from verl_omni.workers.config.rollout import COLLECTIVE, HOST, IPC
from verl_omni.workers.rollout.weight_buckets import WeightBucket

logger = logging.getLogger(__name__)


async def connect_weight_group(actor_wg: Any, servers: Sequence[Any]) -> int:
    """Make the weight group (once per run): actor rank 0 as member 0, then every rollout worker of every server in
    order; everyone joins at once. Returns the group's size."""
    counts = await _on_all(servers, "worker_count")
    group = actor_wg.open_weight_group(1 + sum(counts))[0]
    firsts = [1 + sum(counts[:i]) for i in range(len(servers))]
    sender = actor_wg.join_weight_group()
    calls = [server.join_weight_group.remote(group, first) for server, first in zip(servers, firsts, strict=True)]
    await _settled(servers, calls, "joining the weight group", sender)
    logger.info(
        "weight group of %d members (%s) joined: rollout workers per server %s", group.size, group.backend, counts
    )
    return group.size


async def push_lora(actor_wg: Any, servers: Sequence[Any], transport: str) -> dict[str, float]:
    """The actor's current LoRA to every server by ``transport``; returns the ``sync/*`` metrics (export and push
    seconds, the least modules bound)."""
    start = time.perf_counter()
    if transport == IPC:
        per_rank = actor_wg.share_lora_params()
        export = time.perf_counter() - start
        try:
            bound = await push_lora_to_replicas(servers, per_rank[0][1], shared=[h for h, _ in per_rank])
        finally:
            actor_wg.release_shared()
    elif transport == COLLECTIVE:
        layout, peft_config = actor_wg.stage_lora_params()[0]
        export = time.perf_counter() - start
        sender = actor_wg.send_staged()
        try:
            bound = await push_lora_to_replicas(servers, peft_config, broadcast=layout, sender=sender)
        finally:
            actor_wg.release_shared()
    else:
        tensors, peft_config = actor_wg.get_lora_params()[0]
        export = time.perf_counter() - start
        bound = await push_lora_to_replicas(servers, peft_config, tensors)
    return {
        "sync/export_seconds": export,
        "sync/push_seconds": time.perf_counter() - start - export,
        "sync/lora_modules_bound_min": min(bound),
    }


async def push_lora_to_replicas(
    servers: Sequence[Any],
    peft_config: Mapping[str, Any],
    tensors: Mapping[str, torch.Tensor] | None = None,
    shared: Sequence[Any] | None = None,
    broadcast: Any = None,
    sender: Sequence[Any] = (),
) -> list[int]:
    """Load the adapter on every server (Ray actor handles of ``vLLMOmniHttpServer``); return modules bound per server.

    The adapter is host ``tensors``; or ``shared``: every actor rank's CUDA IPC handle of it (colocated,
    ``DiffusionActorWorker.share_lora_params``), of which each rollout worker opens the one on its GPU; or
    ``broadcast``: the layout of the buffer that ``sender`` (``send_staged``'s calls, in flight) broadcasts
    through the weight group.

    Raises:
        ValueError: no servers or no tensors were given.
        RuntimeError: a server failed to load or bind the adapter (the message names the server index).
    """
    if not servers:
        raise ValueError("push_lora_to_replicas got no rollout servers: launch the replicas first")
    if not tensors and not shared and broadcast is None:
        raise ValueError("push_lora_to_replicas got no LoRA tensors: is model.lora.rank > 0?")
    if shared:
        calls = [server.load_lora_tensors.remote(dict(peft_config), shared=list(shared)) for server in servers]
    elif broadcast is not None:
        calls = [server.load_lora_tensors.remote(dict(peft_config), broadcast=broadcast) for server in servers]
    else:
        cpu_tensors = {name: t.detach().to("cpu") for name, t in tensors.items()}
        calls = [server.load_lora_tensors.remote(dict(peft_config), cpu_tensors) for server in servers]
    results = await _settled(servers, calls, "LoRA sync", sender)
    logger.info("LoRA synced to %d rollout servers; modules bound per server: %s", len(servers), results)
    return list(results)


async def push_full_weights(
    actor_wg: Any,
    servers: Sequence[Any],
    version: int,
    bucket_bytes: int,
    ema: bool = False,
    transport: str = HOST,
    merged_lora: bool = False,
) -> dict[str, float]:
    """One checked full-weight sync from the actor worker group (``DiffusionActorWorker``) to every server; ``ema``:
    the EMA of the weights (``actor.ema_decay``) instead of the live ones, the same names and checks; ``transport``:
    how each bucket travels (module docstring; ``collective`` needs :func:`connect_weight_group` done);
    ``merged_lora``: a LoRA actor's merged weights of the linears it adapts (``model.lora.merge``), of which every
    name must set a rollout parameter (the rest of the transformer is not sent).

    Returns the ``sync/full_weight_*`` metrics (``sync/merged_lora_*`` for a merged LoRA): buckets, megabytes,
    transformer parameters written per server (the least), seconds. Raises ``WeightSyncError`` (a bucket corrupted,
    lost or unloaded) naming the server.
    """
    if not servers:
        raise ValueError("push_full_weights got no rollout servers: launch the replicas first")
    start = time.perf_counter()
    plan = actor_wg.weight_bucket_plan(bucket_bytes)[0]
    await _on_all(servers, "begin_weight_sync", version, len(plan), not merged_lora)

    def gather(index: int):
        refs = actor_wg.get_weight_bucket(plan, version, index, ema, transport)
        # host or collective: rank 0's object reference goes to the servers as it is; ipc: every rank's handle
        return WeightBucket.merged(ray.get(list(refs))) if transport == IPC else refs[0]

    try:
        pending = gather(0)
        for index in range(len(plan)):
            bucket = pending
            # collective: rank 0 broadcasts this bucket (its call queued before the next gather) while the servers
            # receive it; then it gathers the next one while the servers load this one
            sender = actor_wg.send_staged() if transport == COLLECTIVE else ()
            pending = gather(index + 1) if index + 1 < len(plan) else None
            await _on_all(servers, "load_weight_bucket", bucket, sender=sender)
        reports = await _on_all(servers, "finish_weight_sync", version)
    finally:
        if transport != HOST:
            actor_wg.release_shared()
    seconds = time.perf_counter() - start
    what = "merged_lora" if merged_lora else "full_weight"
    logger.info("%s synced to %d servers in %d buckets (%.1f s): %s", what, len(servers), len(plan), seconds, reports)
    return {
        f"sync/{what}_buckets": float(len(plan)),
        f"sync/{what}_megabytes": reports[0]["bytes"] / 2**20,
        f"sync/{what}_params_written_min": float(min(report["params"] for report in reports)),
        f"sync/{what}_seconds": seconds,
    }


async def _on_all(servers: Sequence[Any], method: str, *args, sender: Sequence[Any] = ()) -> list[Any]:
    """``method(*args)`` on every server at once; the first failure raised, naming the server. ``sender``: the
    actor's broadcast calls, in flight with the servers' (awaited after them)."""
    calls = [getattr(s, method).remote(*args) for s in servers]
    return await _settled(servers, calls, f"weight sync ({method})", sender)


async def _settled(servers: Sequence[Any], calls: Sequence[Any], what: str, sender: Sequence[Any]) -> list[Any]:
    """The servers' results; the first failure raised, naming the server, before the sender's calls are awaited
    (a server that failed before it received would leave the broadcast waiting for the group's timeout)."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    failed = [(i, r) for i, r in enumerate(results) if isinstance(r, BaseException)]
    if failed:
        index, error = failed[0]
        raise RuntimeError(
            f"{what} failed on rollout server {index} of {len(servers)} ({len(failed)} failed): {error}"
        ) from error
    try:
        await asyncio.gather(*sender)
    except Exception as error:
        raise RuntimeError(f"{what}: actor rank 0's broadcast to the rollout workers failed: {error}") from error
    return list(results)

"""Pushing the trained weights to every rollout replica, in memory, and checking each one took them.

:class:`RolloutWeightSync` is the whole of it for a run: built once from the run's transport and payload, the
trainer calls :meth:`~RolloutWeightSync.sync` after every update (and once on resume) and
:meth:`~RolloutWeightSync.ema_weights` around a validation that samples the EMA of the weights.

What travels (the payload, :func:`payload_for`):

* ``lora``: the actor exports ``(tensors, peft_config)`` (``DiffusionActorWorker.get_lora_params``); every
  replica's server loads them as a new in-memory adapter and its probe returns how many modules the adapter
  binds. A replica whose adapter binds nothing would keep sampling from the old policy while every training
  metric looks healthy, so any failure fails the sync, naming the replica.
* ``full``: the transformer in size-bounded, checksummed buckets (:mod:`~verl_omni.workers.rollout.weight_buckets`).
  The actor ranks gather one bucket at a time, at most two in flight (the next is gathered while the servers load
  one); each server checks and loads it in its workers, and closing the sync checks that no bucket was lost and
  every transformer parameter was written.
* ``merged_lora`` (``model.lora.merge``): the adapted linears' ``W + scaling · B @ A`` travel as ``full``'s buckets
  do, every name must set a rollout parameter, and the rollout serves no adapter
  (``workers/engine/fsdp/lora_merge.py``).

How it travels (the transport, ``rollout.weight_transport`` resolved by
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

verl's checkpoint engines (``verl.checkpoint_engine``) stream ``(name, tensor)`` pairs into verl's own rollout
replicas; a sync here moves a LoRA adapter as one unit or versioned, checksummed buckets into vLLM-Omni servers
that check them, so the two variations live here, each a small class in a table keyed by its config value.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import ray
import torch

from verl_omni.workers.config.rollout import COLLECTIVE, HOST, IPC, weight_transport_for
from verl_omni.workers.rollout.weight_buckets import WeightBucket

if TYPE_CHECKING:
    from verl_omni.workers.config.model import DiffusionLoraConfig
    from verl_omni.workers.config.rollout import DiffusionRolloutConfig

logger = logging.getLogger(__name__)

LORA, MERGED_LORA, FULL = "lora", "merged_lora", "full"
PAYLOADS = (LORA, MERGED_LORA, FULL)


def payload_for(lora: DiffusionLoraConfig) -> str:
    """What a sync sends for ``model.lora``: the adapter, its merge into the linears it adapts, or the transformer."""
    if lora.rank == 0:
        return FULL
    return MERGED_LORA if lora.merge else LORA


# ---- transports: how the LoRA or a bucket leaves the actor ranks ------------------------------


class HostTransport:
    """Through Ray's object store: rank 0's tensors, nothing held on a device."""

    # the form ``DiffusionActorWorker.get_weight_bucket`` packs a bucket in
    name = HOST

    async def connect(self, actor_wg: Any, servers: Sequence[Any]) -> int:
        """Members of the transport's process group, made once per run (none here)."""
        return 0

    def export_lora(self, actor_wg: Any) -> tuple[Mapping[str, Any], dict[str, Any]]:
        """``(peft_config, how the servers load it)``: the keyword of ``push_lora_to_replicas`` that carries it."""
        tensors, peft_config = actor_wg.get_lora_params()[0]
        return peft_config, {"tensors": tensors}

    def gather_bucket(self, actor_wg: Any, plan: list[list[str]], version: int, index: int, ema: bool) -> Any:
        """Bucket ``index`` as the servers take it (rank 0's object reference: the bucket skips the trainer)."""
        return actor_wg.get_weight_bucket(plan, version, index, ema, self.name)[0]

    def start_send(self, actor_wg: Any) -> Sequence[Any]:
        """The actor's calls that must run beside the servers' receiving ones (a broadcast's sender)."""
        return ()

    def release(self, actor_wg: Any) -> None:
        """Drop what the actor ranks kept for the servers to read."""


class DeviceShareTransport(HostTransport):
    """Colocated on CUDA: every rank's tensors stay on its GPU; the servers open CUDA IPC handles."""

    name = IPC

    def export_lora(self, actor_wg: Any) -> tuple[Mapping[str, Any], dict[str, Any]]:
        per_rank = actor_wg.share_lora_params()
        return per_rank[0][1], {"shared": [handle for handle, _ in per_rank]}

    def gather_bucket(self, actor_wg: Any, plan: list[list[str]], version: int, index: int, ema: bool) -> Any:
        # every rank's handle: each rollout worker opens the one on its GPU
        return WeightBucket.merged(ray.get(list(actor_wg.get_weight_bucket(plan, version, index, ema, self.name))))

    def release(self, actor_wg: Any) -> None:
        actor_wg.release_shared()


class CollectiveTransport(HostTransport):
    """Separate pools: actor rank 0 broadcasts a staged buffer to every rollout worker; its layout goes by Ray."""

    name = COLLECTIVE

    async def connect(self, actor_wg: Any, servers: Sequence[Any]) -> int:
        return await connect_weight_group(actor_wg, servers)

    def export_lora(self, actor_wg: Any) -> tuple[Mapping[str, Any], dict[str, Any]]:
        layout, peft_config = actor_wg.stage_lora_params()[0]
        return peft_config, {"broadcast": layout}

    def start_send(self, actor_wg: Any) -> Sequence[Any]:
        return actor_wg.send_staged()

    def release(self, actor_wg: Any) -> None:
        actor_wg.release_shared()


TRANSPORTS: dict[str, type[HostTransport]] = {
    cls.name: cls for cls in (HostTransport, DeviceShareTransport, CollectiveTransport)
}


# ---- payloads: what one sync sends --------------------------------------------------------------


class AdapterPayload:
    """The LoRA as an adapter every server loads and binds."""

    async def push(self, actor_wg, servers, transport: HostTransport, version: int, ema: bool) -> dict[str, float]:
        """Returns the ``sync/*`` metrics: export and push seconds, the least modules bound."""
        if ema:
            raise ValueError("the EMA of the weights is full fine-tuning's: actor_rollout_ref.model.lora.rank=0")
        start = time.perf_counter()
        peft_config, carried = transport.export_lora(actor_wg)
        export = time.perf_counter() - start
        sender = transport.start_send(actor_wg)
        try:
            bound = await push_lora_to_replicas(servers, peft_config, sender=sender, **carried)
        finally:
            transport.release(actor_wg)
        return {
            "sync/export_seconds": export,
            "sync/push_seconds": time.perf_counter() - start - export,
            "sync/lora_modules_bound_min": min(bound),
        }


class BucketPayload:
    """Transformer weights in checked buckets: all of them (``full``), or the merged LoRA's linears only."""

    def __init__(self, bucket_bytes: int, merged_lora: bool):
        self.bucket_bytes = bucket_bytes
        self.merged_lora = merged_lora

    async def push(self, actor_wg, servers, transport: HostTransport, version: int, ema: bool) -> dict[str, float]:
        """One checked sync numbered ``version``; ``ema``: the EMA of the weights (``actor.ema_decay``), the same
        names and checks. Returns the ``sync/full_weight_*`` metrics (``sync/merged_lora_*`` for a merged LoRA):
        buckets, megabytes, transformer parameters written per server (the least), seconds. Raises
        ``WeightSyncError`` (a bucket corrupted, lost or unloaded) naming the server."""
        if not servers:
            raise ValueError("a full-weight sync got no rollout servers: launch the replicas first")
        start = time.perf_counter()
        plan = actor_wg.weight_bucket_plan(self.bucket_bytes)[0]
        await _on_all(servers, "begin_weight_sync", version, len(plan), not self.merged_lora)
        try:
            pending = transport.gather_bucket(actor_wg, plan, version, 0, ema)
            for index in range(len(plan)):
                bucket = pending
                # collective: rank 0 broadcasts this bucket (its call queued before the next gather) while the
                # servers receive it; then it gathers the next one while the servers load this one
                sender = transport.start_send(actor_wg)
                pending = (
                    transport.gather_bucket(actor_wg, plan, version, index + 1, ema) if index + 1 < len(plan) else None
                )
                await _on_all(servers, "load_weight_bucket", bucket, sender=sender)
            reports = await _on_all(servers, "finish_weight_sync", version)
        finally:
            transport.release(actor_wg)
        seconds = time.perf_counter() - start
        what = MERGED_LORA if self.merged_lora else "full_weight"
        logger.info(
            "%s synced to %d servers in %d buckets (%.1f s): %s", what, len(servers), len(plan), seconds, reports
        )
        return {
            f"sync/{what}_buckets": float(len(plan)),
            f"sync/{what}_megabytes": reports[0]["bytes"] / 2**20,
            f"sync/{what}_params_written_min": float(min(report["params"] for report in reports)),
            f"sync/{what}_seconds": seconds,
        }


# ---- the run's sync -----------------------------------------------------------------------------


class RolloutWeightSync:
    """The actor worker group's weights → every rollout server, by one transport, one payload, for the whole run.

    It holds the run's event loop for the servers' calls and, with the collective transport, the weight group
    (made at the first sync, kept for the run).
    """

    def __init__(
        self,
        actor_wg: Any,
        servers: Sequence[Any],
        transport: str,
        payload: str,
        bucket_bytes: int = 1 << 30,
        colocated: bool = False,
    ):
        """``actor_wg``: the ``DiffusionActorWorker`` group; ``servers``: the ``vLLMOmniHttpServer`` handles;
        ``transport``: ``host`` / ``ipc`` / ``collective``; ``payload``: ``lora`` / ``merged_lora`` / ``full``;
        ``colocated``: the servers sleep between generations and wake to take the weights."""
        if transport not in TRANSPORTS:
            raise ValueError(f"weight transport must be one of {sorted(TRANSPORTS)}, got {transport!r}")
        if payload not in PAYLOADS:
            raise ValueError(f"weight sync payload must be one of {PAYLOADS}, got {payload!r}")
        self.actor_wg, self.servers, self.colocated = actor_wg, list(servers), colocated
        self.transport = TRANSPORTS[transport]()
        self.payload = (
            AdapterPayload() if payload == LORA else BucketPayload(bucket_bytes, merged_lora=payload == MERGED_LORA)
        )
        # members of the collective transport's group, once made (0: none yet, or another transport)
        self.group_size = 0
        self._loop = asyncio.new_event_loop()

    @classmethod
    def from_configs(
        cls,
        actor_wg: Any,
        servers: Sequence[Any],
        rollout: DiffusionRolloutConfig,
        lora: DiffusionLoraConfig,
        colocated: bool,
        device: str,
    ) -> RolloutWeightSync:
        """The run's sync: ``rollout.weight_transport`` resolved for the placement, the payload ``model.lora``
        asks for, buckets of ``rollout.checkpoint_engine.update_weights_bucket_megabytes``."""
        return cls(
            actor_wg,
            servers,
            transport=weight_transport_for(
                rollout.weight_transport, colocated, device, rollout.ulysses_sequence_parallel_size
            ),
            payload=payload_for(lora),
            bucket_bytes=rollout.checkpoint_engine.update_weights_bucket_megabytes << 20,
            colocated=colocated,
        )

    def sync(self, step: int) -> dict[str, float]:
        """The weights after ``step`` updates to every server, checked there (or this raises); the ``sync/*``
        metrics."""
        metrics = {}
        start = time.perf_counter()
        if self.colocated:
            # what the actor phases left reserved on the shared devices goes back before the servers need it
            metrics["sync/actor_cache_released_gib"] = max(self.actor_wg.release_device_cache())
            ray.get([server.wake_up.remote() for server in self.servers])
        metrics["sync/wake_seconds"] = time.perf_counter() - start
        metrics.update(self._push(step))
        if self.group_size:
            # the collective transport's group: actor rank 0 and every rollout worker it broadcast to
            metrics["sync/weight_group_members"] = float(self.group_size)
        return metrics

    @contextmanager
    def ema_weights(self, step: int) -> Iterator[None]:
        """The servers sample the EMA of the weights inside, the live weights again after (full fine-tuning)."""
        self._push(step, ema=True)
        yield
        self._push(step)

    def close(self) -> None:
        """The end of the run: the event loop goes."""
        self._loop.close()

    def _push(self, step: int, ema: bool = False) -> dict[str, float]:
        return self._loop.run_until_complete(self._connect_and_push(step, ema))

    async def _connect_and_push(self, step: int, ema: bool) -> dict[str, float]:
        if not self.group_size:
            self.group_size = await self.transport.connect(self.actor_wg, self.servers)
        return await self.payload.push(self.actor_wg, self.servers, self.transport, step, ema)


# ---- the servers' calls -------------------------------------------------------------------------


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

"""Tensors broadcast from actor rank 0 to every rollout worker through a process group of their own.

Separate pools put the rollout on other GPUs than the actor: CUDA IPC (:mod:`device_share`) cannot reach them,
and host buckets through Ray's object store and the worker RPC move the 20 B transformer at about 0.11 GB/s. Here
actor rank 0 and every rollout worker process (all replicas) form one group, built once and reused: a
``TCPStore`` the sender hosts (:class:`CollectiveSender`, the port chosen by the OS) and a backend by device,
NCCL on CUDA and gloo on the CPU, constructed directly. No ``init_process_group``: the actor's default group
is FSDP's and the rollout worker's are vLLM's; a second default group would clash with both.

Per bucket the sender packs the tensors into one buffer (``device_share.pack``) and computes its checksum;
only the layout and checksum travel in the Ray message (:class:`BroadcastTensors`). Each receiver allocates a
buffer of that length, takes part in the broadcast (:func:`receive`), and checks the checksum before it reads a
tensor (:func:`open_received`). A broadcast completes only when every member has issued it: the sender's call and
the receivers' calls must be in flight together (``weight_sync``), and a receiver about to refuse a bucket still
receives it first, or the sender would wait until the group's timeout.
"""

from __future__ import annotations

import datetime
import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeAlias

import torch
import torch.distributed as dist

from verl_omni.workers.rollout import device_share

logger = logging.getLogger(__name__)

# how long a member waits for the others (to join, or in a broadcast) before the group fails
GROUP_TIMEOUT = datetime.timedelta(minutes=10)
# the store's key prefix: the group's keys never meet another group's on the same store
STORE_PREFIX = "verl_omni_weight_group"
# a member's process group: a c10d backend constructed directly (no global registration)
GroupBackend: TypeAlias = "dist.ProcessGroupNCCL | dist.ProcessGroupGloo"


@dataclass(frozen=True)
class WeightGroup:
    """Where and how to join the weight group (what the sender hands every receiver).

    Args:
        host (`str`): the sender's address, where its ``TCPStore`` listens.
        port (`int`): the store's port.
        size (`int`): members: 1 sender + every rollout worker process of every replica.
        backend (`str`): ``"nccl"`` (CUDA) or ``"gloo"`` (CPU).
    """

    host: str
    port: int
    size: int
    backend: str


# one packed buffer on its way through the group, as a receiver needs it before the bytes arrive: the layout and
# length it allocates and unpacks by, the checksum the sender computed (``device_share``)
BroadcastTensors = device_share.PackedTensors


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def join(group: WeightGroup, rank: int, device: torch.device, store: dist.Store | None = None) -> GroupBackend:
    """This process's member (``rank``) of ``group``, its collectives on ``device``; blocks until all have joined.

    The sender passes its own store; a receiver connects to the sender's. A one-element all-reduce checks the
    group (and makes NCCL build its communicator now, while every member is waiting for it).
    """
    if not 0 <= rank < group.size:
        raise ValueError(f"weight group rank {rank} outside the group's {group.size} members")
    if store is None:
        store = dist.TCPStore(group.host, group.port, group.size, is_master=False, timeout=GROUP_TIMEOUT)
    prefixed = dist.PrefixStore(STORE_PREFIX, store)
    if group.backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = GROUP_TIMEOUT
        torch.cuda.set_device(device)
        process_group = dist.ProcessGroupNCCL(prefixed, rank, group.size, options)
    elif group.backend == "gloo":
        process_group = dist.ProcessGroupGloo(prefixed, rank, group.size, GROUP_TIMEOUT)
    else:
        raise ValueError(f"weight group backend {group.backend!r}: nccl (CUDA) or gloo (CPU)")
    members = torch.ones(1, device=device)
    process_group.allreduce([members]).wait()
    _synchronize(device)
    if int(members.item()) != group.size:
        raise RuntimeError(f"weight group of {group.size} members counted {int(members.item())} at its first call")
    logger.info("joined the weight group %s:%d as %d of %d (%s)", group.host, group.port, rank, group.size, device)
    return process_group


def receive(process_group: GroupBackend, sent: BroadcastTensors, device: torch.device) -> torch.Tensor:
    """The sender's buffer, received on ``device`` (unchecked: :func:`open_received` checks it)."""
    buffer = torch.empty(sent.nbytes, dtype=torch.uint8, device=device)
    _broadcast(process_group, buffer)
    return buffer


def open_received(buffer: torch.Tensor, sent: BroadcastTensors) -> dict[str, torch.Tensor]:
    """The tensors of a received buffer, as views of it, once its checksum is the sender's.

    Raises:
        RuntimeError: the buffer differs from what the sender packed (length or checksum).
    """
    actual = device_share.device_checksum(buffer)
    if buffer.numel() != sent.nbytes or actual != sent.checksum:
        raise RuntimeError(
            f"the broadcast weight buffer received is not the one sent ({buffer.numel()} bytes, checksum {actual}; "
            f"sent {sent.nbytes} bytes, checksum {sent.checksum})"
        )
    return device_share.unpack(buffer, sent.layout)


class CollectiveSender:
    """Actor rank 0's end of the weight group: hosts its store, packs buffers and broadcasts them in order.

    Args:
        size (`int`): members of the group (1 + rollout worker processes).
        device (`torch.device`): where the buffers are packed and sent from (a CUDA device: NCCL; the CPU: gloo).
        host (`str`): this process's address as the receivers reach it.
    """

    def __init__(self, size: int, device: torch.device, host: str):
        self.device = device
        # port 0: the OS picks a free one, no window for another process to take it
        self.store = dist.TCPStore(host, 0, size, is_master=True, wait_for_workers=False, timeout=GROUP_TIMEOUT)
        self.group = WeightGroup(host, self.store.port, size, backend_for(device))
        self.process_group: GroupBackend | None = None
        # buffers packed and not sent yet, oldest first (the next bucket is packed while the rollout loads one)
        self.staged: deque[torch.Tensor] = deque()

    def connect(self) -> None:
        """Join as member 0 (while every receiver joins)."""
        self.process_group = join(self.group, 0, self.device, self.store)

    def stage(self, tensors: Mapping[str, torch.Tensor]) -> BroadcastTensors:
        """Pack ``tensors`` for the next :meth:`send`; returns what the receivers need to take it."""
        buffer, layout = device_share.pack(tensors, self.device)
        sent = BroadcastTensors(layout, buffer.numel(), device_share.device_checksum(buffer))
        self.staged.append(buffer)
        return sent

    def send(self) -> int:
        """Broadcast the oldest staged buffer (the receivers take it meanwhile); returns its bytes."""
        if self.process_group is None:
            raise RuntimeError("the weight group is not connected: connect() runs once, with every receiver joining")
        if not self.staged:
            raise RuntimeError("nothing staged to send: stage() packs a buffer first")
        buffer = self.staged.popleft()
        _broadcast(self.process_group, buffer)
        return buffer.numel()

    def drop_staged(self) -> None:
        """Forget buffers packed but not sent (a sync that failed half way)."""
        self.staged.clear()


def _broadcast(process_group: GroupBackend, buffer: torch.Tensor) -> None:
    options = dist.BroadcastOptions()
    options.rootRank = 0
    process_group.broadcast([buffer], options).wait()
    _synchronize(buffer.device)


def _synchronize(device: torch.device) -> None:
    """NCCL's ``wait`` only orders the current stream after the collective: wait for the device itself."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)

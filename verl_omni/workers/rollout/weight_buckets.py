"""Full transformer weights on their way to the rollout: size-bounded buckets, each checked where it lands.

A full fine-tuning run sends the whole transformer after every update (LoRA runs send the adapter,
:mod:`~verl_omni.workers.rollout.weight_sync`). One sync is a numbered version of ``count`` buckets:

* the sender plans the buckets from the tensors' names and sizes (:func:`plan_buckets`, in the
  trained module's order, at most ``bucket_bytes`` each; a tensor larger than that travels alone),
  and builds each as a :class:`WeightBucket` whose checksum covers its names, dtypes, shapes and bytes;
* the receiver (:class:`WeightSyncReceiver`, one per rollout worker) checks every bucket's checksum
  before it loads it, refuses buckets of another sync or a second copy of one, and at the end checks
  that every bucket arrived and that every parameter of the rollout's module was written.

A bucket lost or corrupted on the way therefore fails the sync with an error naming it, instead of
leaving the rollout sampling from a mix of old and new weights while training looks healthy. The
transport is not this module's: on CPU buckets travel through Ray's object store (shared memory on a
node, ``weight_sync.BucketPayload``) and the engine's worker RPC; colocated on a GPU a bucket stays on
the device and only its CUDA IPC handle travels (:mod:`~verl_omni.workers.rollout.device_share`); separate
pools on GPUs broadcast it from actor rank 0 to every rollout worker over NCCL
(:mod:`~verl_omni.workers.rollout.collective_share`; ``docs/guide/training.md``, "Full fine-tuning").
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from verl_omni.workers.rollout.collective_share import BroadcastTensors

logger = logging.getLogger(__name__)


class WeightSyncError(RuntimeError):
    """A full-weight sync did not deliver the trained weights intact (a bucket lost, corrupted or unloaded)."""


def bucket_checksum(tensors: Mapping[str, torch.Tensor]) -> str:
    """A content hash of a bucket: names, dtypes, shapes and the raw bytes of every tensor, in order."""
    digest = hashlib.blake2b(digest_size=16)
    for name, tensor in tensors.items():
        tensor = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def plan_buckets(sizes: Iterable[tuple[str, int]], bucket_bytes: int) -> list[list[str]]:
    """Names grouped into buckets of at most ``bucket_bytes`` (in the given order); a larger tensor gets its own.

    Args:
        sizes: ``(name, bytes)`` of every tensor to send, in the order the sender walks its module.
        bucket_bytes: the bound on one bucket's payload (> 0).
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    buckets: list[list[str]] = []
    current: list[str] = []
    filled = 0
    for name, nbytes in sizes:
        if current and filled + nbytes > bucket_bytes:
            buckets.append(current)
            current, filled = [], 0
        current.append(name)
        filled += nbytes
    if current:
        buckets.append(current)
    return buckets


@dataclass
class WeightBucket:
    """One bucket of one sync.

    Args:
        version (`int`): the sync it belongs to (the trainer's global step).
        index (`int`): its position in the sync, ``0 <= index < count``.
        count (`int`): buckets in the sync.
        tensors (`dict[str, torch.Tensor]`): full tensors on CPU under the trained module's (diffusers) names.
        checksum (`str`): :func:`bucket_checksum` of ``tensors`` as the sender built them.
        shared (`tuple[SharedTensors, ...]`): instead of ``tensors``, the bucket packed on the senders' GPUs, one
            per GPU, for CUDA IPC (:mod:`~verl_omni.workers.rollout.device_share`, which checks it on arrival).
        broadcast (`BroadcastTensors`, *optional*): instead of ``tensors``, the layout and checksum of the bucket
            that actor rank 0 broadcasts through the weight group
            (:mod:`~verl_omni.workers.rollout.collective_share`); the bytes arrive beside this message.
    """

    version: int
    index: int
    count: int
    tensors: dict[str, torch.Tensor] = field(repr=False)
    checksum: str
    shared: tuple = ()
    broadcast: BroadcastTensors | None = None

    @classmethod
    def shared_build(cls, version: int, index: int, count: int, handle) -> WeightBucket:
        """The bucket as one sender GPU shares it (``device_share.share``); :meth:`merged` joins the GPUs'."""
        return cls(version, index, count, {}, "", (handle,))

    @classmethod
    def merged(cls, buckets: Iterable[WeightBucket]) -> WeightBucket:
        """One shared bucket from every sender rank's copy of it (each receiver opens the one on its GPU)."""
        buckets = list(buckets)
        first = buckets[0]
        return cls(first.version, first.index, first.count, {}, "", tuple(h for b in buckets for h in b.shared))

    @classmethod
    def broadcast_build(cls, version: int, index: int, count: int, sent) -> WeightBucket:
        """The bucket as actor rank 0 broadcasts it (``collective_share.CollectiveSender.stage``)."""
        return cls(version, index, count, {}, "", broadcast=sent)

    @classmethod
    def build(cls, version: int, index: int, count: int, tensors: Mapping[str, torch.Tensor]) -> WeightBucket:
        """The bucket of ``tensors`` (moved to CPU), checksummed by the sender."""
        cpu = {name: t.detach().to("cpu").contiguous() for name, t in tensors.items()}
        return cls(version, index, count, cpu, bucket_checksum(cpu))

    @property
    def nbytes(self) -> int:
        if self.shared:
            return self.shared[0].nbytes
        if self.broadcast is not None:
            return self.broadcast.nbytes
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def to_fields(self) -> dict:
        """Plain fields for an RPC that rebuilds objects on the way (the engine's worker RPC)."""
        return {
            "version": self.version,
            "index": self.index,
            "count": self.count,
            "tensors": self.tensors,
            "checksum": self.checksum,
            "shared": self.shared,
            "broadcast": self.broadcast,
        }


def buckets_of(version: int, tensors: Mapping[str, torch.Tensor], bucket_bytes: int) -> Iterable[WeightBucket]:
    """The buckets of a whole state dict held in memory (a test, or a caller that already has every tensor)."""
    plan = plan_buckets(((n, t.numel() * t.element_size()) for n, t in tensors.items()), bucket_bytes)
    for index, names in enumerate(plan):
        yield WeightBucket.build(version, index, len(plan), {n: tensors[n] for n in names})


class WeightSyncReceiver:
    """The rollout worker's side of a sync: checks each bucket, loads it, and checks the whole at the end.

    Args:
        load (`Callable[[list[tuple[str, torch.Tensor]]], set[str]]`): writes named tensors into the rollout
            model and returns the names of what it set (the pipeline's ``load_weights``, prefix applied).
        expected (`Callable[[], set[str]]` or None): the parameter names of the rollout's module that a complete
            sync must write (read when a sync ends); None: a partial sync (the merged LoRA's adapted linears,
            ``model.lora.merge``), of which every name sent must set a rollout parameter instead.
    """

    def __init__(
        self, load: Callable[[list[tuple[str, torch.Tensor]]], set[str]], expected: Callable[[], set[str]] | None
    ):
        self.load = load
        self.expected = expected
        self.version: int | None = None
        self.count = 0
        self.received: dict[int, int] = {}
        self.loaded: set[str] = set()
        self.bytes = 0
        self.broken: str | None = None

    def begin(self, version: int, count: int) -> None:
        """Start sync ``version`` of ``count`` buckets (a sync left unfinished is dropped with a warning)."""
        if count < 1:
            raise WeightSyncError(f"weight sync {version} announces {count} buckets: nothing to send")
        if self.version is not None:
            logger.warning("weight sync %s was not finished before sync %s began", self.version, version)
        self.version, self.count = version, count
        self.received, self.loaded, self.bytes, self.broken = {}, set(), 0, None

    def receive(self, bucket: WeightBucket, received: torch.Tensor | None = None) -> int:
        """Check ``bucket`` and load it; returns how many names the rollout set from it. ``received``: a broadcast
        bucket's buffer, taken from the weight group before any check (every member must take part)."""
        if self.version is None or bucket.version != self.version:
            raise WeightSyncError(
                f"bucket {bucket.index} of weight sync {bucket.version} arrived while sync {self.version} is open"
            )
        if bucket.count != self.count or not 0 <= bucket.index < self.count:
            raise WeightSyncError(
                f"bucket {bucket.index}/{bucket.count} of weight sync {bucket.version} does not fit its "
                f"announced {self.count} buckets"
            )
        if bucket.index in self.received:
            raise WeightSyncError(f"bucket {bucket.index} of weight sync {bucket.version} arrived twice")
        tensors = self._checked_tensors(bucket, received)
        loaded = set(self.load(list(tensors.items())))
        if self.expected is None:
            loaded |= self._each_name_loaded(bucket, tensors, loaded)
        del tensors  # shared buckets: views of the sender's GPU memory, let go before it frees them
        if not loaded:
            self.broken = f"bucket {bucket.index} loaded nothing"
            names = _names(bucket)
            raise WeightSyncError(
                f"bucket {bucket.index} of weight sync {bucket.version} set no rollout parameter (names like "
                f"{names[:4]}): the rollout does not know these names"
            )
        self.received[bucket.index] = len(loaded)
        self.loaded |= set(loaded)
        self.bytes += bucket.nbytes
        return len(loaded)

    def _each_name_loaded(self, bucket: WeightBucket, tensors: dict[str, torch.Tensor], loaded: set[str]) -> set[str]:
        """A partial sync has no list of parameters to check at the end, so each name sent must have set one: a name
        the load reported (under any prefix) passes; one it did not is loaded alone, and must set something (a
        loader may report only the fused parameter it wrote, e.g. ``to_qkv`` for ``to_q``)."""
        reported = {".".join(parts[i:]) for parts in (name.split(".") for name in loaded) for i in range(len(parts))}
        more: set[str] = set()
        for name in (name for name in tensors if name not in reported):
            alone = set(self.load([(name, tensors[name])]))
            if not alone:
                self.broken = f"bucket {bucket.index} loaded nothing for {name}"
                raise WeightSyncError(
                    f"bucket {bucket.index} of weight sync {bucket.version}: {name} set no rollout parameter (the "
                    "rollout does not know this name)"
                )
            more |= alone
        return more

    def _checked_tensors(self, bucket: WeightBucket, received: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """The bucket's tensors once its checksum holds (a shared bucket: opened on this GPU and checked there; a
        broadcast one: checked in the buffer received)."""
        if bucket.shared or bucket.broadcast is not None:
            from verl_omni.workers.rollout import collective_share, device_share

            try:
                if bucket.shared:
                    return device_share.open_shared(bucket.shared)
                if received is None:
                    raise RuntimeError("its buffer was not received from the weight group")
                return collective_share.open_received(received, bucket.broadcast)
            except RuntimeError as error:
                self.broken = f"bucket {bucket.index} not opened intact"
                raise WeightSyncError(f"bucket {bucket.index} of weight sync {bucket.version}: {error}") from error
        actual = bucket_checksum(bucket.tensors)
        if actual != bucket.checksum:
            self.broken = f"bucket {bucket.index} corrupted"
            raise WeightSyncError(
                f"bucket {bucket.index} of weight sync {bucket.version} is corrupted: checksum {actual} on arrival, "
                f"{bucket.checksum} when sent (tensors {sorted(bucket.tensors)[:4]}...); it was not loaded"
            )
        return bucket.tensors

    def finish(self, version: int) -> dict[str, int]:
        """Close sync ``version``: every bucket arrived and every expected parameter was written, else raise.

        Returns:
            ``{"buckets", "bytes", "params"}``: what this sync delivered (params: expected names written; a partial
            sync: the names its loads reported).
        """
        if self.version != version:
            raise WeightSyncError(f"finish of weight sync {version}, but sync {self.version} is open")
        self.version = None
        if self.broken:
            raise WeightSyncError(
                f"weight sync {version} failed earlier ({self.broken}): the rollout weights are mixed"
            )
        missing_buckets = sorted(set(range(self.count)) - set(self.received))
        if missing_buckets:
            raise WeightSyncError(
                f"weight sync {version} lost buckets {missing_buckets} of {self.count}: the rollout holds a mix of "
                "old and new weights"
            )
        if self.expected is None:
            return {"buckets": self.count, "bytes": self.bytes, "params": len(self.loaded)}
        expected = self.expected()
        unwritten = sorted(expected - self.loaded)
        if unwritten:
            raise WeightSyncError(
                f"weight sync {version} wrote {len(expected) - len(unwritten)} of the rollout's {len(expected)} "
                f"parameters; not written: {unwritten[:6]}"
            )
        return {"buckets": self.count, "bytes": self.bytes, "params": len(expected)}


def _names(bucket: WeightBucket) -> list[str]:
    if bucket.shared:
        return bucket.shared[0].names
    if bucket.broadcast is not None:
        return bucket.broadcast.names
    return sorted(bucket.tensors)

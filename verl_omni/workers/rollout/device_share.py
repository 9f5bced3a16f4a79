"""Tensors handed to a rollout worker on the same GPU through CUDA IPC, with no copy through the host.

Colocated, the actor and the rollout share one GPU. Moved as host tensors, the trained weights are copied
to the host, pickled by Ray to the trainer, again to each server, and again through vLLM-Omni's worker RPC,
then copied back to the device: seconds for a rank-64 LoRA of a 20 B transformer, a minute for its full
weights. Instead the sender packs the tensors into one device buffer (:func:`pack`) and sends what CUDA IPC
needs to open it (:class:`SharedTensors`: a handle of a few hundred bytes, the layout and a checksum); the
rollout worker opens it (:func:`open_shared`), reads the tensors where they lie, copies them into its own
modules and lets go. The sender keeps the buffer until the receivers are done with it.

Every sender rank shares its own copy, tagged with its GPU's UUID; a receiver takes the one on its own GPU,
so the processes need not agree on device indices (each Ray actor sees its GPUs as 0, 1, ...). The checksum,
computed on the device at both ends, shows the receiver opened the sender's buffer intact: a buffer freed
or refilled too early fails the sync instead of loading wrong weights.

CUDA IPC needs the caching allocator's plain segments: a buffer is allocated with expandable segments off
(:func:`pack`), which verl also turns off around its own weight sync.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

# byte alignment of every tensor in a packed buffer (any dtype's view of it is aligned)
ALIGNMENT = 64
# int32 words per slice of the checksum (bounds its temporary int64 copy to 256 MiB)
CHECKSUM_WORDS = 1 << 25
# odd multiplier of the word positions in the checksum: a moved or swapped word changes the sum
POSITION_MULTIPLIER = 0x9E3779B1


@dataclass(frozen=True)
class PackedTensors:
    """What a receiver needs to read a packed buffer (:func:`pack`) and check it, whichever way its bytes travel.

    Args:
        layout (`tuple`): ``(name, dtype name, shape, byte offset)`` of each tensor in the buffer.
        nbytes (`int`): the buffer's length.
        checksum (`int`): :func:`device_checksum` of the buffer as sent.
    """

    layout: tuple[tuple[str, str, tuple[int, ...], int], ...]
    nbytes: int
    checksum: int

    @property
    def names(self) -> list[str]:
        return [entry[0] for entry in self.layout]


@dataclass(frozen=True)
class SharedTensors(PackedTensors):
    """One packed device buffer as another process on the same GPU opens it.

    Args:
        device_uuid (`str`): the sender's GPU, as ``torch.cuda.get_device_properties(i).uuid`` prints it.
        handle (`tuple`): ``torch.multiprocessing.reductions.reduce_tensor`` of the buffer: its rebuild function
            and arguments (argument 6 is the device index, which the receiver replaces by its own).
        (and :class:`PackedTensors`' layout, length and checksum)
    """

    device_uuid: str = ""
    handle: tuple = ()


def device_uuid(device: torch.device) -> str:
    return str(torch.cuda.get_device_properties(device).uuid)


def pack(tensors: Mapping[str, torch.Tensor], device: torch.device) -> tuple[torch.Tensor, tuple]:
    """``tensors`` copied into one uint8 buffer on ``device``; returns the buffer and its layout."""
    layout, offset = [], 0
    for name, tensor in tensors.items():
        layout.append((name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), offset))
        offset += -(-tensor.numel() * tensor.element_size() // ALIGNMENT) * ALIGNMENT
    with _plain_segments(device):
        buffer = torch.empty(max(offset, ALIGNMENT), dtype=torch.uint8, device=device)
    for (_, _, _, start), tensor in zip(layout, tensors.values(), strict=True):
        _view(buffer, tensor.dtype, tensor.shape, start).copy_(tensor, non_blocking=True)
    return buffer, tuple(layout)


def unpack(buffer: torch.Tensor, layout: Sequence[tuple[str, str, tuple[int, ...], int]]) -> dict[str, torch.Tensor]:
    """The tensors of a packed buffer, as views of it (no copy)."""
    return {name: _view(buffer, getattr(torch, dtype), shape, start) for name, dtype, shape, start in layout}


def device_checksum(buffer: torch.Tensor) -> int:
    """A position-weighted sum of the buffer's int32 words, computed where the buffer lies (int64, wrapping).

    Not a cryptographic hash: it catches a buffer that is not the one sent (freed, refilled, another sync's)
    or whose bytes moved, at the cost of one read of the buffer on the device.
    """
    words = buffer[: buffer.numel() // 4 * 4].view(torch.int32)
    total = torch.zeros((), dtype=torch.int64, device=buffer.device)
    for start in range(0, words.numel(), CHECKSUM_WORDS):
        part = words[start : start + CHECKSUM_WORDS].to(torch.int64)
        positions = torch.arange(start, start + part.numel(), dtype=torch.int64, device=buffer.device)
        total += (part * (positions * POSITION_MULTIPLIER + 1)).sum()
    tail = buffer[words.numel() * 4 :].to(torch.int64).sum()
    return int(total + tail)


def share(tensors: Mapping[str, torch.Tensor], device: torch.device) -> tuple[SharedTensors, torch.Tensor]:
    """Pack ``tensors`` on ``device`` (a CUDA device) for another process; returns the description to send and
    the buffer, which the caller keeps alive until every receiver is done (then drops it)."""
    from torch.multiprocessing.reductions import reduce_tensor

    buffer, layout = pack(tensors, device)
    torch.cuda.synchronize(device)
    shared = SharedTensors(
        layout, buffer.numel(), device_checksum(buffer), device_uuid=device_uuid(device), handle=reduce_tensor(buffer)
    )
    return shared, buffer


def open_shared(candidates: Sequence[SharedTensors]) -> dict[str, torch.Tensor]:
    """The tensors of the candidate on this process's current GPU, as views of the sender's buffer.

    The views alias the sender's memory: copy what must outlive the sync, and drop the views (then call
    ``torch.cuda.ipc_collect()``) before the sender lets go of its buffer.

    Raises:
        RuntimeError: no candidate lies on this GPU, or the opened buffer's checksum differs from the sent one.
    """
    device = torch.device("cuda", torch.cuda.current_device())
    own = device_uuid(device)
    shared = next((c for c in candidates if c.device_uuid == own), None)
    if shared is None:
        raise RuntimeError(
            f"no sender shared weights on this rollout worker's GPU {own} (senders' GPUs: "
            f"{sorted({c.device_uuid for c in candidates})}): CUDA IPC needs an actor rank on every rollout GPU"
        )
    rebuild, args = shared.handle
    args = list(args)
    args[6] = device.index
    buffer = rebuild(*args)
    actual = device_checksum(buffer)
    if buffer.numel() != shared.nbytes or actual != shared.checksum:
        raise RuntimeError(
            f"the shared weight buffer opened on {own} is not the one sent ({buffer.numel()} bytes, checksum "
            f"{actual}; sent {shared.nbytes} bytes, checksum {shared.checksum}): the sender freed or refilled it"
        )
    return unpack(buffer, shared.layout)


def _view(buffer: torch.Tensor, dtype: torch.dtype, shape: Sequence[int], start: int) -> torch.Tensor:
    count = 1
    for size in shape:
        count *= size
    nbytes = count * dtype.itemsize
    return buffer[start : start + nbytes].view(dtype).view(tuple(shape))


@contextmanager
def _plain_segments(device: torch.device):
    """Expandable segments off while the buffer is allocated (CUDA IPC cannot share them), then the process's own
    setting again (``PYTORCH_CUDA_ALLOC_CONF``); a no-op off CUDA."""
    if device.type != "cuda":
        yield
        return
    from verl.utils.device import set_expandable_segments

    set_expandable_segments(False)
    try:
        yield
    finally:
        set_expandable_segments("expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""))

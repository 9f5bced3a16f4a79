"""Packing for the CUDA IPC weight sync (``device_share``): layout, views and checksum, on any device.

Opening a buffer by CUDA IPC needs two processes on one GPU: the GPU engine tests do that
(``vllm_omni/test_rollout_engine_gpu.py``: a LoRA and full weights through the real engine's worker).
"""

import pytest
import torch

from verl_omni.workers.rollout import device_share


def _tensors():
    gen = torch.Generator().manual_seed(0)
    return {
        "a.weight": torch.randn(3, 5, generator=gen),
        "b.bias": torch.randn(7, generator=gen).to(torch.bfloat16),
        "c.count": torch.tensor([1, 2, 3], dtype=torch.int64),
        "d.scalar": torch.tensor(0.5),
    }


def test_pack_then_unpack_gives_every_tensor_back_aligned():
    tensors = _tensors()
    buffer, layout = device_share.pack(tensors, torch.device("cpu"))
    assert [entry[0] for entry in layout] == list(tensors)
    assert all(entry[3] % device_share.ALIGNMENT == 0 for entry in layout)
    back = device_share.unpack(buffer, layout)
    for name, tensor in tensors.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor)
    # views of the buffer, not copies: the receiver copies what it keeps
    back["a.weight"].zero_()
    assert torch.count_nonzero(device_share.unpack(buffer, layout)["a.weight"]) == 0


@pytest.mark.parametrize("change", ["one byte", "two words swapped"])
def test_the_checksum_sees_a_changed_or_moved_word(change):
    buffer, _ = device_share.pack(_tensors(), torch.device("cpu"))
    before = device_share.device_checksum(buffer)
    assert device_share.device_checksum(buffer.clone()) == before
    words = buffer[: buffer.numel() // 4 * 4].view(torch.int32)
    if change == "one byte":
        buffer[5] += 1
    else:
        first, second = words[0].item(), words[1].item()
        assert first != second
        words[0], words[1] = second, first
    assert device_share.device_checksum(buffer) != before


def test_the_checksum_covers_a_buffer_longer_than_one_slice(monkeypatch):
    monkeypatch.setattr(device_share, "CHECKSUM_WORDS", 4)
    buffer = torch.arange(64, dtype=torch.uint8)
    before = device_share.device_checksum(buffer)
    buffer[-1] += 1
    assert device_share.device_checksum(buffer) != before

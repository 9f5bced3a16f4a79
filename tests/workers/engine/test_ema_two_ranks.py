"""The EMA of the weights over two FSDP2 ranks (``ema_two_ranks.py``, gloo): shards updated alone equal the EMA of
the full tensors, bit for bit, through the EMA's gather (what the validation sync sends) and through the swap (what
the ``transformer_ema/`` export writes), with uneven and empty shards; the live weights come back."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from two_rank_launch import run_two_ranks

HERE = Path(__file__).resolve().parent
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def per_rank(tmp_path_factory):
    out = tmp_path_factory.mktemp("ema_two_ranks")
    run_two_ranks(HERE / "ema_two_ranks.py", out, timeout=500, OMP_NUM_THREADS="1")
    return torch.load(out / "results.pt", weights_only=False)


def test_shards_are_uneven_and_one_is_empty(per_rank):
    shapes = [results["shard_shapes"] for results in per_rank]
    assert shapes[0]["a.weight"] == (3, 3) and shapes[1]["a.weight"] == (2, 3)
    assert shapes[0]["b.weight"] == (1, 5) and shapes[1]["b.weight"] == (0, 5)


def test_every_rank_gathers_the_ema_of_the_full_tensors_and_the_buffers_as_they_are(per_rank):
    for results in per_rank:
        assert results["gathered_is_the_full_ema"] and results["ema_differs_from_live"]
        assert results["names"] == ["a.bias", "a.weight", "b.bias", "b.weight", "scale"]
        assert torch.equal(results["gathered_buffer"], torch.tensor([2.0]))


def test_the_swap_exports_the_full_ema_and_gives_the_live_weights_back(per_rank):
    assert per_rank[0]["exported_is_the_full_ema"]
    assert all(results["live_back"] for results in per_rank)

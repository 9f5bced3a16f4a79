"""Ulysses sequence parallelism in the replay on 2 GPUs (NCCL, the engine's default bf16 compute): split and
unsplit replays of ``sequence_parallel_ranks.py`` agree within bf16's rounding (the CPU tests hold them to fp32's, and
to these bounds for both Wan2.2 models computing in bf16 on gloo)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_sequence_parallel import assert_bf16_split_matches_unsplit
from two_rank_launch import run_two_ranks

HERE = Path(__file__).resolve().parent

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="a sequence-parallel group of 2 needs 2 GPUs"),
]


@pytest.mark.parametrize("name", ["wan2_2", "wan2_2_a14b", "qwen_image"])
def test_split_replay_in_bf16_gives_the_unsplit_log_probs_and_gradients(name, tiny_model, tmp_path):
    out = tmp_path / "results.pt"
    run_two_ranks(HERE / "sequence_parallel_ranks.py", name, tiny_model(name), out, "cuda", timeout=900)
    assert_bf16_split_matches_unsplit(torch.load(out, weights_only=False))

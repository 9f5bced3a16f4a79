"""Ulysses sequence parallelism in the replay on 2 GPUs (NCCL, the engine's default bf16 compute): split and
unsplit replays of ``sequence_parallel_ranks.py`` agree within bf16's rounding (the CPU test holds them to fp32's)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from two_rank_launch import run_two_ranks

HERE = Path(__file__).resolve().parent

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="a sequence-parallel group of 2 needs 2 GPUs"),
]


@pytest.mark.parametrize("name", ["wan2_2", "qwen_image"])
def test_split_replay_in_bf16_gives_the_unsplit_log_probs_and_gradients(name, tiny_model, tmp_path):
    out = tmp_path / "results.pt"
    run_two_ranks(HERE / "sequence_parallel_ranks.py", name, tiny_model(name), out, "cuda", timeout=900)
    results = torch.load(out, weights_only=False)
    for key in ("log_probs", "train_log_probs"):
        assert bool(torch.isfinite(results[f"{key}_1"]).all())
        torch.testing.assert_close(results[f"{key}_2"], results[f"{key}_1"], rtol=0, atol=2e-3)
    unsplit, split = results["grads_1"], results["grads_2"]
    for param, grad in unsplit.items():
        if grad is None:
            assert split[param] is None, param
            continue
        # bf16 forward and backward: each tensor's gradient agrees to a few percent of its largest entry
        scale = grad.abs().max().clamp_min(1e-12)
        assert (split[param] - grad).abs().max() / scale < 5e-2, param
    torch.testing.assert_close(results["resumed_log_probs_1"], results["stepped_log_probs_2"], rtol=0, atol=2e-3)

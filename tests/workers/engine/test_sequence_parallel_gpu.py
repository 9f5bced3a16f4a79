"""Ulysses sequence parallelism in the replay on 2 GPUs (NCCL), ``sequence_parallel_ranks.py`` launched once per
model with two cases: FSDP2 computing in fp32 and in the engine's default bf16.

* fp32: the split replay is the unsplit one on CUDA as on the CPU: log-probs to 1e-5, every LoRA gradient to 1e-4 of
  its largest entry.
* bf16: a bf16 backward on CUDA rounds each LoRA gradient by up to a third of its largest entry on these tiny
  models (measured against the fp32 run), split or not, so the split and unsplit gradients are two roundings of one
  value: each must lie within twice the unsplit's own rounding of the other. The log-probs agree to 2e-3, and the
  checkpoint saved split resumes unsplit.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from figures import figure
from sequence_parallel_ranks import result_path
from test_sequence_parallel import assert_bf16_split_matches_unsplit
from two_rank_launch import run_two_ranks

HERE = Path(__file__).resolve().parent

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="a sequence-parallel group of 2 needs 2 GPUs"),
]


def relative_errors(grads: dict, reference: dict) -> dict[str, float]:
    """Each LoRA tensor's largest gradient difference from ``reference``, over the reference's largest entry."""
    return {
        name: ((grads[name].float() - ref).abs().max() / ref.abs().max().clamp_min(1e-12)).item()
        for name, ref in reference.items()
        if ref is not None
    }


def assert_split_matches_unsplit_on_cuda(fp32: dict, bf16: dict) -> None:
    for key in ("log_probs", "train_log_probs"):
        torch.testing.assert_close(fp32[f"{key}_2"], fp32[f"{key}_1"], rtol=0, atol=1e-5)
    exact = relative_errors(fp32["grads_2"], fp32["grads_1"])
    figure("fp32_split_vs_unsplit_grad_max", max(exact.values()))
    assert max(exact.values()) < 1e-4, exact

    # log-probs, finiteness, the resumed checkpoint and the None pattern of the gradients, as on the CPU in bf16
    assert_bf16_split_matches_unsplit(bf16, grad_bound=None)
    rounding = relative_errors(bf16["grads_1"], fp32["grads_1"])
    split = relative_errors(bf16["grads_2"], bf16["grads_1"])
    figure("bf16_unsplit_vs_fp32_grad_max", max(rounding.values()))
    figure("bf16_split_vs_unsplit_grad_max", max(split.values()))
    beyond = {n: (split[n], rounding[n]) for n in split if split[n] > 2 * rounding[n] + 1e-3}
    assert not beyond, f"split vs unsplit beyond twice the unsplit's bf16 rounding: {beyond}"


@pytest.mark.parametrize("name", ["wan2_2", "wan2_2_a14b", "qwen_image"])
def test_split_replay_on_two_gpus_gives_the_unsplit_log_probs_and_gradients(name, tiny_model, tmp_path):
    cases = [f"{name}:{compute}:{tiny_model(name)}" for compute in ("fp32", "default")]
    run_two_ranks(HERE / "sequence_parallel_ranks.py", "cuda", tmp_path, *cases, timeout=1800)
    fp32, bf16 = (torch.load(result_path(tmp_path, name, c), weights_only=False) for c in ("fp32", "default"))
    assert_split_matches_unsplit_on_cuda(fp32, bf16)

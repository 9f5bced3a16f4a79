"""The sequence-parallel replay benchmark's smoke mode on two gloo ranks: one sample split (sp 2), a row per A14B
expert with its throughput per GPU and TFLOP/s, the JSON under $OUT. The data-parallel comparison (``--sp 1``)
shares every step but the mesh's shape; it is left to the GPU runs to keep the suite's two-rank launches few."""

import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "sequence_parallel_replay.py"
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workers" / "engine"))

from two_rank_launch import run_two_ranks  # noqa: E402

pytestmark = pytest.mark.slow


def test_two_ranks_report_each_experts_replay_per_gpu(tmp_path):
    sp = 2
    run_two_ranks(
        SCRIPT, "--smoke", "--model", "wan2_2_a14b", "--sp", sp, "--flop-count", timeout=600, OUT=str(tmp_path)
    )

    result = json.loads((tmp_path / f"wan2_2_a14b_sp{sp}_replay.json").read_text())
    assert (result["ranks"], result["sp"], result["micro_batch"]) == (2, sp, 1)
    assert result["mode"] == "sequence parallel over 2 ranks"
    rows = result["rows"]
    assert [row["expert"] for row in rows] == ["transformer", "transformer_2"]
    for row in rows:
        assert row["s_per_sample"] == row["step_s"] > 0
        # a group of sp GPUs finishes one sample per step
        assert row["samples_per_s_per_gpu"] == pytest.approx(1 / (row["step_s"] * sp))
        # no GPU: no peak memory, one entry per rank
        assert row["peak_memory_gb_per_rank"] == [None, None]
        assert row["tflops_per_gpu"] > 0
        assert row["fraction_of_matmul_ceiling"] == pytest.approx(
            row["tflops_per_gpu"] / result["matmul_ceiling_tflops"]
        )
    # the tiny high-noise expert has two blocks, the low-noise one one: more FLOPs per sample
    flops = [row["tflops_per_gpu"] * row["step_s"] for row in rows]
    assert flops[0] > 1.5 * flops[1]

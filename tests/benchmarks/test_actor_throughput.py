"""The actor benchmark runs end to end on the tiny model and counts the replay's FLOPs."""

import json

import pytest
from benchmark_scripts import load_benchmark


@pytest.mark.slow  # the actor's update over four variant x micro-batch runs plus a profiled one: a trainer run
def test_actor_throughput_reports_every_micro_batch(tmp_path, tiny_qwen_image_path):
    actor_throughput = load_benchmark("actor_throughput")

    out = tmp_path / "bench.json"
    argv = ["--model-path", str(tiny_qwen_image_path), "--micro-batches", "1", "2", "--size", "32", "--cfg", "4"]
    argv += ["--variants", "sequential", "batched"]
    profile = tmp_path / "profile.txt"
    rows = actor_throughput.main(argv + ["--warmup", "0", "--iters", "1", "--out", str(out), "--profile", str(profile)])

    assert [(r["variant"], r["micro_batch"]) for r in rows] == [("sequential", 1), ("sequential", 2)] + [
        ("batched", 1),
        ("batched", 2),
    ]
    assert all(r["samples_per_s"] > 0 and r["tflops"] > 0 for r in rows)
    # the variants replay the same math: one FLOP count per micro-batch serves both
    assert rows[0]["flops"] > 0 and rows[2]["flops"] is None
    saved = json.loads(out.read_text())
    assert saved["meta"]["matmul_ceiling_tflops"] > 0 and len(saved["results"]) == 4
    # the kernel-time breakdown covers the largest micro-batch and finds the matmuls
    assert saved["meta"]["profile"]["micro_batch"] == 2
    assert saved["meta"]["profile"]["by_category_ms"].get("matmul", 0) > 0
    assert profile.read_text().startswith("micro-batch 2:")


def test_compiled_variant_must_come_last():
    import pytest

    with pytest.raises(SystemExit):
        load_benchmark("actor_throughput").parse_args(["--variants", "compiled", "batched"])

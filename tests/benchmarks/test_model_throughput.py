"""The model benchmark's smoke mode runs end to end on each tiny model: both engines, the ratio, the replay rows."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "model_throughput.py"

pytestmark = pytest.mark.slow


def _load_benchmark():
    spec = importlib.util.spec_from_file_location("model_throughput", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["model_throughput"] = module
    spec.loader.exec_module(module)
    return module


REPLAY_ONLY = ("wan2_2_a14b",)
TWO_EXPERTS = ("wan2_2_a14b", "wan2_2_i2v_a14b")
EXPERTS = ["transformer", "transformer_2"]


# FLUX.2-dev is left out: its entry differs from klein's only in its pipelines' names and guidance, and its two
# engines' warm-ups alone take 20 s on two cores
@pytest.mark.parametrize(
    "model",
    [
        "sd3",
        "flux2_klein",
        "wan2_2",
        "wan2_2_a14b",
        "wan2_2_i2v_a14b",
        "hunyuan_video_1_5",
        "ltx2",
        "qwen_image_edit",
    ],
)
def test_benchmark_reports_the_ratio_to_stock_and_the_replay_row(model, tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    argv = ["--model", model, "--n", "2", "--repeats", "1", "--micro-batches", "1", "--warmup", "0", "--iters", "1"]
    result = _load_benchmark().main(argv)

    if model in REPLAY_ONLY:
        # replay only: no engine serves the two experts here
        assert "rollout" not in result
    elif model == "flux2_klein":
        # stock vLLM-Omni 0.26 does not start a klein engine: ours alone, and no ratio claimed
        assert result["rollout"]["ours_per_s"] > 0 and "ratio_ours_to_stock" not in result["rollout"]
    else:
        rollout = result["rollout"]
        assert rollout["ours_per_s"] > 0 and rollout["stock_per_s"] > 0
        assert rollout["ratio_ours_to_stock"] == pytest.approx(rollout["ours_per_s"] / rollout["stock_per_s"])
    if model == "qwen_image_edit":
        # rollout only: the editing model's replay is not part of this benchmark
        assert "replay" not in result
    else:
        rows = result["replay"]["rows"]
        # the A14B: one row per expert, each at a step that expert sampled (the tiny experts differ in depth, so
        # the high-noise expert's two blocks count more FLOPs than the low-noise expert's one)
        assert [row.get("expert") for row in rows] == (EXPERTS if model in TWO_EXPERTS else [None])
        for row in rows:
            assert row["micro_batch"] == 1 and row["tflops"] > 0 and row["s_per_sample"] == row["step_s"]
            assert 0 < row["fraction_of_matmul_ceiling"] == row["tflops"] / result["replay"]["matmul_ceiling_tflops"]
        if model in TWO_EXPERTS:
            flops = [row["tflops"] * row["step_s"] for row in rows]
            assert flops[0] > 1.5 * flops[1]
    # $OUT gets the same JSON the last stdout line carries
    assert json.loads((tmp_path / f"{model}_throughput.json").read_text()) == json.loads(json.dumps(result))

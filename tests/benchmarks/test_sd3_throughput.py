"""The SD3.5 benchmark's smoke mode runs end to end on the tiny model: both engines, the ratio, the replay fraction."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "sd3_throughput.py"

pytestmark = pytest.mark.slow


def _load_benchmark():
    spec = importlib.util.spec_from_file_location("sd3_throughput", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["sd3_throughput"] = module
    spec.loader.exec_module(module)
    return module


def test_sd3_benchmark_reports_the_ratio_to_stock_and_the_replay_fraction(tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    result = _load_benchmark().main(
        ["--n", "2", "--repeats", "1", "--micro-batches", "1", "--warmup", "0", "--iters", "1"]
    )

    rollout = result["rollout"]
    assert rollout["ours_img_s"] > 0 and rollout["stock_img_s"] > 0
    assert rollout["ratio_ours_to_stock"] == pytest.approx(rollout["ours_img_s"] / rollout["stock_img_s"])
    (row,) = result["replay"]["rows"]
    assert row["micro_batch"] == 1 and row["tflops"] > 0
    assert 0 < row["fraction_of_matmul_ceiling"] == row["tflops"] / result["replay"]["matmul_ceiling_tflops"]
    # $OUT gets the same JSON the last stdout line carries
    assert json.loads((tmp_path / "sd3_throughput.json").read_text()) == json.loads(json.dumps(result))

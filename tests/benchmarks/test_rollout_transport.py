"""The rollout-transport benchmark runs its hops on a small request and reports each, the final-pixels path taken."""

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "rollout_transport.py"


def _load_benchmark():
    spec = importlib.util.spec_from_file_location("rollout_transport", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["rollout_transport"] = module
    spec.loader.exec_module(module)
    return module


def test_rollout_transport_times_every_hop_on_the_final_pixels_path():
    benchmark = _load_benchmark()
    result = benchmark.main(["--n", "2", "--size", "64", "--steps", "3", "--repeats", "1"])
    assert result["final_pixels_hook"] is True
    for kind in ("wall", "cpu"):
        assert set(result[f"{kind}_ms"]) == set(benchmark.HOPS)
        assert all(ms >= 0 for ms in result[f"{kind}_ms"].values())
    # two 64² samples: pixels, latents and log-probs of each, the conditioning rows once (2 x 333 x 4096 bf16)
    assert 5.0 < result["trainer_hop_mb"] < 6.0

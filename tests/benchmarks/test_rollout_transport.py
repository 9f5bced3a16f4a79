"""The rollout-transport benchmark runs its hops on a small request and reports each, the final-pixels path taken."""

from benchmark_scripts import load_benchmark


def test_rollout_transport_times_every_hop_on_the_final_pixels_path():
    benchmark = load_benchmark("rollout_transport")
    result = benchmark.main(["--n", "2", "--size", "64", "--steps", "3", "--repeats", "1"])
    assert result["final_pixels_hook"] is True
    for kind in ("wall", "cpu"):
        assert set(result[f"{kind}_ms"]) == set(benchmark.HOPS)
        assert all(ms >= 0 for ms in result[f"{kind}_ms"].values())
    # two 64² samples: pixels, latents and log-probs of each, the conditioning rows once (2 x 333 x 4096 bf16)
    assert 5.0 < result["trainer_hop_mb"] < 6.0

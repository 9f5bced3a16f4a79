"""The model benchmark's smoke mode runs end to end on each tiny model: both engines, the ratio, the replay rows."""

import json

import pytest
from benchmark_scripts import load_benchmark

pytestmark = pytest.mark.slow


REPLAY_ONLY = ("wan2_2_a14b",)
TWO_EXPERTS = ("wan2_2_a14b", "wan2_2_i2v_a14b")
EXPERTS = ["transformer", "transformer_2"]
# the models whose smoke run takes its FLOPs from the meta count (--meta-flop-count): the two whose replay reads
# values (HunyuanVideo-1.5's masks, the I2V-A14B's timesteps picking an expert)
META_COUNTED = ("hunyuan_video_1_5", "wan2_2_i2v_a14b")


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
    result = load_benchmark("model_throughput").main(argv + (["--meta-flop-count"] if model in META_COUNTED else []))

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
            # the replay's rate from the FLOPs counted on meta (the fallback of a device count out of memory)
            assert row.get("flops_counted_on") == ("meta" if model in META_COUNTED else None)
            assert row["tflops"] == pytest.approx(row["flops"] / row["step_s"] / 1e12)
            assert 0 < row["fraction_of_matmul_ceiling"] == row["tflops"] / result["replay"]["matmul_ceiling_tflops"]
        if model in TWO_EXPERTS:
            flops = [row["tflops"] * row["step_s"] for row in rows]
            assert flops[0] > 1.5 * flops[1]
    # $OUT gets the same JSON the last stdout line carries
    assert json.loads((tmp_path / f"{model}_throughput.json").read_text()) == json.loads(json.dumps(result))


# the two models whose replay reads values: HunyuanVideo-1.5's prompt masks reorder its tokens, the I2V-A14B's
# timesteps pick the expert
@pytest.mark.parametrize("model", ["hunyuan_video_1_5", "wan2_2_i2v_a14b"])
def test_the_flop_count_on_meta_is_the_count_on_real_tensors(model, tmp_path):
    """``--parts flops`` counts on the meta device what the replay's own count counts on real tensors: the tiny
    model both ways, attention as SDPA's math path in both (the CPU's fused attention kernel has no FLOP formula, so
    the real count could not see the fused one); per expert, the A14B's two differing in depth."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from verl_omni.utils.tiny_models import build_tiny_model

    bench = load_benchmark("model_throughput")
    from actor_throughput import count_flops
    from bench_models import MODELS, build_replay_model
    from bench_replay_batches import replay_batch_fn
    from meta_flops import META, count_replay_flops, meta_batch

    args = bench.parse_args(["--model", model, "--parts", "flops"])
    entry, cpu = MODELS[model], torch.device("cpu")
    model_path = build_tiny_model(entry.builder, tmp_path / model, seed=0)
    spec, scheduler, vae_scale = bench.replay_setting(args, model_path)
    adapter = entry.load_adapter()
    real = build_replay_model(entry, args, model_path, cpu, torch.float32)
    on_meta = build_replay_model(entry, args, model_path, META, torch.float32)
    counts = []
    for expert in entry.experts or (None,):
        batch_fn = replay_batch_fn(entry, args, expert)
        batch = batch_fn(real, spec, 1, args.text_len, vae_scale, cpu, scheduler)
        with sdpa_kernel(SDPBackend.MATH):
            real_count = count_flops(real, scheduler, batch, spec, vae_scale, torch.float32, adapter, False, False)
        shaped = meta_batch(batch_fn, on_meta, spec, args.text_len, vae_scale, scheduler)
        meta_count = count_replay_flops(on_meta, scheduler, shaped, spec, vae_scale, adapter, fused_attention=False)
        assert meta_count == real_count > 0
        counts.append(meta_count)
    if entry.experts:
        assert counts[0] > 1.5 * counts[1]

"""SD3.5 Medium on one device: our rollout pipeline vs stock vLLM-Omni's SD3 pipeline, and the LoRA replay.

One run, two parts:

* **rollout**: N images of one prompt per request, the Flow-GRPO SD3.5 recipe's sampling (512², 10
  steps, CFG 4.5 with the empty negative prompt): our log-prob pipeline
  (``SD3LogProbPipeline`` in ``OmniRolloutEngine``, one ``generate_batched(N)`` request) and vLLM-Omni's
  own ``StableDiffusion3Pipeline`` (one request with ``num_outputs_per_prompt=N``). Each engine is
  warmed once, then timed over ``--repeats`` requests; the ratio ours / stock is printed (the
  target is >= 0.99);
* **replay**: the actor's unit of work on SD3 (one recorded transition: velocity with classic CFG,
  SDE step, log-prob, backward into a LoRA of the recipe's rank 32), samples/s per micro-batch and
  its TFLOP/s as a fraction of the measured matmul ceiling (``actor_throughput.py``'s loop).

Full size (``--full-size``, CUDA): SD3.5 Medium's transformer and VAE with random bf16 weights
(``random_weights.py``: no weight file; the tiny text encoders), the replay on the released
architecture. Without it: the tiny random SD3.5 on whatever device is present, fp32, a few steps:
the smoke mode the CPU test runs. The last stdout line is one JSON object, also written to
``$OUT/sd3_throughput.json`` when ``OUT`` is set (or to ``--out``).

    python benchmarks/sd3_throughput.py --full-size          # H100/H200: the issue's measurement
    python benchmarks/sd3_throughput.py                      # CPU smoke run (tiny model)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from actor_throughput import matmul_ceiling_tflops, measure  # noqa: E402
from rollout_throughput import engine_kwargs, time_rounds  # noqa: E402

logger = logging.getLogger("sd3_throughput")

PROMPT = "a red cat on a chair near a window"
# Flow-GRPO's SD3.5 recipe (examples/flowgrpo_trainer/run_sd3_ocr_lora.sh): CFG 4.5, empty negative prompt
CFG = 4.5
LORA_RANK, LORA_ALPHA = 32, 64
# CLIP's 77 tokens then T5's 256 (the rollout pipeline's max_sequence_length)
TEXT_LEN = 77 + 256


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--full-size", action="store_true", help="SD3.5 Medium architecture, random bf16 weights, CUDA")
    p.add_argument("--parts", nargs="+", choices=("rollout", "replay"), default=["rollout", "replay"])
    p.add_argument("--n", type=int, default=16, help="images per prompt (one request)")
    p.add_argument("--steps", type=int, help="denoising steps (default 10 full size, 2 tiny)")
    p.add_argument("--size", type=int, help="image side (default 512 full size, 32 tiny)")
    p.add_argument("--repeats", type=int, default=3, help="timed requests per engine")
    p.add_argument("--micro-batches", type=int, nargs="+", help="replay micro-batches (default 1 4 9; tiny 1 2)")
    p.add_argument("--warmup", type=int, default=2, help="replay warm-up iterations")
    p.add_argument("--iters", type=int, default=5, help="replay timed iterations")
    p.add_argument("--compile", action="store_true", help="CUDA: let the engines torch.compile (slow start)")
    p.add_argument(
        "--profile",
        action="store_true",
        help="after the timed requests, one more of each engine under the engine's torch profiler (worker ops, "
        "CPU and CUDA): its tables under $OUT/profile/{ours,stock} and the request's wall split in the JSON",
    )
    p.add_argument("--out", help="write the JSON result here (default $OUT/sd3_throughput.json when OUT is set)")
    args = p.parse_args(argv)
    args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.full_size and args.device != "cuda":
        p.error("--full-size needs a CUDA device")
    args.steps = args.steps or (10 if args.full_size else 2)
    args.size = args.size or (512 if args.full_size else 32)
    args.micro_batches = args.micro_batches or ([1, 4, 9] if args.full_size else [1, 2])
    args.dtype = "bfloat16" if args.full_size else "float32"
    if args.out is None and os.environ.get("OUT"):
        args.out = str(Path(os.environ["OUT"]) / "sd3_throughput.json")
    if args.profile and not args.out:
        p.error("--profile writes its tables next to the JSON: set OUT or --out")
    # rollout_throughput's helpers read these
    args.cfg, args.requests = [CFG], 1
    args.profiled = {}
    return args


def profile_folder(args, name: str) -> Path:
    return Path(args.out).resolve().parent / "profile" / name


def profiler_kwargs(args, name: str) -> dict:
    """The engine's torch profiler (vLLM's ``ProfilerConfig``) when ``--profile``: no stacks, no gzip, tables kept."""
    if not args.profile:
        return {}
    folder = profile_folder(args, name)
    folder.mkdir(parents=True, exist_ok=True)
    config = {"profiler": "torch", "torch_profiler_dir": str(folder), "torch_profiler_with_stack": False}
    return {"profiler_config": config | {"torch_profiler_use_gzip": False}}


async def profiled_request(args, engine, name: str, call) -> float:
    """Seconds of one request run under the engine's profiler (started before, stopped after it).

    The profiler writes into a timestamped folder; its table and gzipped trace are copied up to
    ``profile/{name}_profiler_out.txt`` and ``profile/{name}_trace.json.gz`` (a device run's ``$OUT``
    returns shallow files only)."""
    import gzip
    import shutil

    await engine.start_profile(profile_prefix=name)
    start = time.perf_counter()
    await call()
    seconds = time.perf_counter() - start
    await engine.stop_profile()
    folder = profile_folder(args, name)
    for table in folder.rglob("profiler_out_*.txt"):
        shutil.copy(table, folder.parent / f"{name}_profiler_out.txt")
    for trace in folder.rglob("trace*.json"):
        with trace.open("rb") as src, gzip.open(folder.parent / f"{name}_trace.json.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
    return seconds


def sampling(args, seed: int) -> dict:
    return {
        "height": args.size,
        "width": args.size,
        "num_inference_steps": args.steps,
        "true_cfg_scale": CFG,
        "noise_level": 0.7,
        "sde_window_size": 2,
        "seed": seed,
    }


async def time_ours(args, model_path: Path, pipeline: str | None) -> float:
    """Seconds per ``generate_batched(N)`` request of our log-prob pipeline (empty negative prompt: none sent)."""
    from transformers import AutoTokenizer

    from verl_omni.pipelines.sd3.training_adapter import SD3TrainingAdapter as adapter
    from verl_omni.workers.rollout.vllm_omni.engine import OmniRolloutEngine

    tokenizer = AutoTokenizer.from_pretrained(model_path, subfolder=adapter.tokenizer_subfolder)
    ids = adapter.prompt_token_ids(tokenizer, PROMPT)
    warmup = None if args.full_size else (args.size, args.size)
    engine = OmniRolloutEngine(
        str(model_path),
        dtype=args.dtype,
        max_batch_requests=1,
        custom_pipeline=pipeline,
        warmup_size=warmup,
        **engine_kwargs(args),
        **profiler_kwargs(args, "ours"),
    )
    engine.start()

    async def one(cfg, r):
        outs = await engine.engine_call(ids, sampling(args, 1000 * r), f"ours-{r}", args.n)
        assert len(outs) == args.n

    try:
        seconds = (await time_rounds({"ours": one}, args.cfg, args.repeats))["ours", CFG]
        if args.profile:
            args.profiled["ours"] = await profile_ours(args, engine, one)
        return seconds
    finally:
        engine.shutdown()


async def profile_ours(args, engine, one) -> dict:
    """A profiled request of ours, with the client's unpacking (per-sample images and trajectories) timed apart."""
    from verl_omni.workers.rollout.vllm_omni import engine as engine_module

    unpack, unpack_s = engine_module.unpack_request_output, []

    def timed_unpack(*a, **kw):
        start = time.perf_counter()
        try:
            return unpack(*a, **kw)
        finally:
            unpack_s.append(time.perf_counter() - start)

    engine_module.unpack_request_output = timed_unpack
    try:
        wall = await profiled_request(args, engine._require_engine(), "ours", lambda: one(CFG, args.repeats + 1))
    finally:
        engine_module.unpack_request_output = unpack
    return {"request_s": wall, "client_unpack_s": sum(unpack_s)}


async def time_stock(args, model_path: Path, pipeline: str | None) -> float:
    """Seconds per request of vLLM-Omni's SD3 pipeline with ``num_outputs_per_prompt=N`` (CFG 4.5, empty negative)."""
    from vllm_omni.entrypoints.async_omni import AsyncOmni
    from vllm_omni.inputs.data import OmniDiffusionSamplingParams

    from verl_omni.workers.rollout.vllm_omni.engine import DEFAULT_BATCH_WAIT_MS

    extra = {"custom_pipeline_args": {"pipeline_class": pipeline}} if pipeline else {}
    if args.device == "cpu":
        # the CPU platform's warm-up at the timed size, as our engine's (not vLLM-Omni's 512²)
        from verl_omni.platforms.cpu_patches import engine_start_config
        from verl_omni.workers.rollout.vllm_omni.engine import DEFAULT_ENGINE_START_TIMEOUT_S

        size = (args.size, args.size)
        extra["additional_config"] = engine_start_config(size, DEFAULT_ENGINE_START_TIMEOUT_S, "sd3_throughput stock")
    # the rollout engine's admission wait too: the comparison is of pipelines, not of admission
    engine = AsyncOmni(
        model=str(model_path),
        dtype=args.dtype,
        max_num_seqs=1,
        request_batch_max_wait_ms=DEFAULT_BATCH_WAIT_MS,
        **extra,
        **engine_kwargs(args),
        **profiler_kwargs(args, "stock"),
    )

    async def one(cfg, r):
        params = OmniDiffusionSamplingParams(
            height=args.size,
            width=args.size,
            num_inference_steps=args.steps,
            num_outputs_per_prompt=args.n,
            guidance_scale=CFG,
            seed=r,
        )
        prompt = {"prompt": PROMPT, "negative_prompt": ""}
        async for _ in engine.generate(prompt=prompt, request_id=f"stock-{r}", sampling_params_list=[params]):
            pass

    try:
        seconds = (await time_rounds({"stock": one}, args.cfg, args.repeats))["stock", CFG]
        if args.profile:
            wall = await profiled_request(args, engine, "stock", lambda: one(CFG, args.repeats + 1))
            args.profiled["stock"] = {"request_s": wall}
        return seconds
    finally:
        engine.shutdown()


def rollout_part(args, model_path: Path) -> dict:
    ours_pipeline = stock_pipeline = None
    if args.full_size:
        from random_weights import SD3_LOG_PROB_PIPELINE, SD3_STOCK_PIPELINE

        ours_pipeline, stock_pipeline = SD3_LOG_PROB_PIPELINE, SD3_STOCK_PIPELINE
    ours = asyncio.run(time_ours(args, model_path, ours_pipeline))
    stock = asyncio.run(time_stock(args, model_path, stock_pipeline))
    result = {"ours_img_s": args.n / ours, "stock_img_s": args.n / stock, "ratio_ours_to_stock": stock / ours}
    if args.profile:
        result["profiled_request"] = args.profiled
    logger.info(
        "rollout, %d images of one prompt: ours %.4g img/s, stock %.4g img/s, ours/stock %.4f",
        args.n,
        result["ours_img_s"],
        result["stock_img_s"],
        result["ratio_ours_to_stock"],
    )
    return result


def replay_batch(model, spec, batch: int, text_len: int, vae_scale_factor: int, device, scheduler) -> dict:
    """Random recorded SD3 transitions at the first step, shaped as the rollout records them (CFG: negatives)."""
    from verl_omni.pipelines.sd3.training_adapter import SD3TrainingAdapter as adapter
    from verl_omni.workers.utils.replay import prepare_scheduler

    cells = (spec.height // (2 * vae_scale_factor)) * (spec.width // (2 * vae_scale_factor))
    prepare_scheduler(adapter, scheduler, spec, cells)
    config = model.config
    fields = {
        "all_latents": torch.randn(batch, 2, cells, 4 * config.in_channels, device=device),
        "all_timesteps": scheduler.timesteps[:1].expand(batch, 1).to(device),
        "prompt_embeds": torch.randn(batch, text_len, config.joint_attention_dim, device=device),
        "pooled_prompt_embeds": torch.randn(batch, config.pooled_projection_dim, device=device),
    }
    if spec.uses_cfg:
        fields["negative_prompt_embeds"] = torch.randn_like(fields["prompt_embeds"])
        fields["negative_pooled_prompt_embeds"] = torch.randn_like(fields["pooled_prompt_embeds"])
    return fields


def build_replay_model(args, model_path: Path, device: torch.device, dtype: torch.dtype):
    """The SD3 transformer (SD3.5 Medium with its released text widths at full size) with the recipe's LoRA."""
    from diffusers import SD3Transformer2DModel
    from peft import LoraConfig

    from verl_omni.pipelines.sd3.training_adapter import SD3TrainingAdapter as adapter

    if args.full_size:
        from random_weights import SD35_MEDIUM_TRANSFORMER

        with torch.device(device):
            model = SD3Transformer2DModel(**SD35_MEDIUM_TRANSFORMER).to(dtype)
    else:
        model = adapter.build_module(model_path, dtype=dtype).to(device)
    model.enable_gradient_checkpointing()
    model.requires_grad_(False)
    model.add_adapter(LoraConfig(r=LORA_RANK, lora_alpha=LORA_ALPHA, target_modules=list(adapter.lora_target_modules)))
    for param in model.parameters():
        if param.requires_grad:
            param.data = param.data.float()
    return model


def replay_part(args, model_path: Path) -> dict:
    from verl_omni.pipelines.sampling import SamplingSpec
    from verl_omni.pipelines.sd3.training_adapter import SD3TrainingAdapter as adapter

    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.full_size else torch.float32
    spec = SamplingSpec(
        num_inference_steps=args.steps, height=args.size, width=args.size, noise_level=0.7, true_cfg_scale=CFG
    )
    model = build_replay_model(args, model_path, device, dtype)
    scheduler = adapter.build_scheduler(model_path)
    vae_scale = 8 if args.full_size else adapter.vae_scale_factor(model_path)
    args.text_len = TEXT_LEN
    ceiling = matmul_ceiling_tflops(device, dtype, 8192 if device.type == "cuda" else 1024)
    rows = []
    for micro_batch in args.micro_batches:
        row = measure(model, scheduler, spec, args, micro_batch, vae_scale, device, dtype, adapter, replay_batch)
        row["fraction_of_matmul_ceiling"] = row["tflops"] / ceiling
        rows.append(row)
        logger.info(
            "replay micro-batch %d: %.4g samples/s, %.4g TFLOP/s (%.1f%% of the %.4g TFLOP/s matmul ceiling)",
            micro_batch,
            row["samples_per_s"],
            row["tflops"],
            100 * row["fraction_of_matmul_ceiling"],
            ceiling,
        )
    return {"matmul_ceiling_tflops": ceiling, "lora_rank": LORA_RANK, "rows": rows}


def main(argv=None) -> dict:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    # the engines import the random-weight pipelines by name in their own processes
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    result = {
        "model": "SD3.5 Medium (random weights)" if args.full_size else "tiny random SD3.5",
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "n": args.n,
        "steps": args.steps,
        "size": args.size,
        "cfg": CFG,
    }
    with tempfile.TemporaryDirectory(prefix="sd3_bench_") as tmp:
        if args.full_size:
            from random_weights import write_full_size_sd3_dir

            model_path = write_full_size_sd3_dir(Path(tmp) / "sd35_medium")
        else:
            from verl_omni.utils.tiny_models import build_tiny_model

            model_path = build_tiny_model("sd3", Path(tmp) / "tiny_sd3", seed=0)
        start = time.perf_counter()
        if "rollout" in args.parts:
            result["rollout"] = rollout_part(args, model_path)
        if "replay" in args.parts:
            result["replay"] = replay_part(args, model_path)
        result["wall_s"] = round(time.perf_counter() - start, 1)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()

"""Rollout throughput of one replica: the ways to make N images of one prompt, side by side in one run.

Modes (all the same prompt, size and steps; ``--cfg`` lists the true-CFG scales to run, 1 = off):

* ``concurrent``: N concurrent ``generate`` (N=1) requests to our log-prob engine, which may batch
  queued requests (``max_num_seqs=N``);
* ``batched``: one ``generate_batched(N)`` request to the same engine (one transformer batch);
  ``--requests R`` sends R of them at once (R x N images in one transformer batch, like a trainer
  step's R prompt groups);
* ``serial``: N concurrent single requests to an engine that runs one request at a time
  (``max_num_seqs=1``), i.e. no batching at all;
* ``stock``: vLLM-Omni's own Qwen-Image pipeline, one request with ``num_outputs_per_prompt=N``;
* ``diffusers``: diffusers' ``QwenImagePipeline`` at batch N.

``--profile`` runs one more batched request under the engine's torch profiler after the timed rounds (a table
of the worker's ops and a trace, in ``profile/`` beside ``--out``).

``--thin RATIO`` (with ``--window-range R0 R1``, R1 < steps) adds ``concurrent_thin`` / ``batched_thin`` rows on
the same engine: the same requests with the ODE after the window range thinned (``ode_solver=dpmsolver++``,
``ode_post_window_ratio=RATIO``; docs/guide/rollout.md); their ``model_calls`` per image are fewer, the recorded
windows are the same.

``--lora-rank R`` (``--lora-alpha``, default 2R) adds a ``batched_lora`` row on the same engine: the batched
requests with a seeded random adapter of rank R on the recipe's targets (``weight_sync.recipe_lora``), pushed once
before the warm-up as the trainer's host sync does (``load_lora_tensors``). Its rounds alternate with the plain
ones, which keep vLLM-Omni's LoRA layers but no active adapter (each ``batched_lora`` round re-activates it: a
copy into the layers' buffers). Its FLOP fraction counts the base transformer's FLOPs only.

Each (mode, cfg) is warmed up once, then timed over ``--repeats`` rounds; modes sharing an engine
alternate round by round. Every row also reports the fraction of the FLOP limit: the measured
bf16/fp32 matmul ceiling divided by the transformer FLOPs per image (``FlopCounterMode`` on a
meta-device copy, × steps, × 2 with CFG). The last stdout line is one JSON object.

    python benchmarks/rollout_throughput.py                      # CPU, tiny random model, fp32
    python benchmarks/rollout_throughput.py --device cuda --full-size --n 16 --steps 50 --cfg 1 4
    python benchmarks/rollout_throughput.py --modes batched --steps 10 --window-range 0 5 --thin 0.7 --cfg 1
    python benchmarks/rollout_throughput.py --modes batched --steps 4 --n 2 --lora-rank 4 --cfg 1 --repeats 1

``--full-size``: the real Qwen-Image transformer and VAE with random bf16 weights filled on the GPU
(no weight file, see ``random_weights.py``), the tiny model's text encoder.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from actor_throughput import matmul_ceiling_tflops

logger = logging.getLogger("rollout_throughput")

PROMPT = "a red cat on a chair near a window"
NEGATIVE = " "
MODES = ("concurrent", "batched", "serial", "stock", "diffusers")
HERE = Path(__file__).resolve().parent


def sampling(args, cfg: float, seed: int, thin: bool = False) -> dict:
    params = {
        "height": args.size,
        "width": args.size,
        "num_inference_steps": args.steps,
        "true_cfg_scale": cfg,
        "noise_level": 0.7,
        "sde_window_size": 2,
        "seed": seed,
    }
    if args.window_range:
        params["sde_window_range"] = list(args.window_range)
    if thin:
        params |= {"ode_solver": "dpmsolver++", "ode_post_window_ratio": args.thin}
    return params


def model_calls(args, mode: str) -> int:
    """Transformer calls per image (without CFG's second pass): a ``*_thin`` mode's thinned schedule, else steps."""
    if not mode.endswith("_thin"):
        return args.steps
    from verl_omni.pipelines.schedulers.mix_ode import flash_model_calls

    return flash_model_calls(args.steps, args.window_range[1], args.thin)


def engine_kwargs(args) -> dict:
    """Eager unless ``--compile`` (vLLM-Omni's torch.compile of the transformer blocks, every size symbolic unless
    ``--compile-dynamic false``: the rollout's ``engine_kwargs.vllm_omni.diffusion_compile_dynamic``)."""
    if args.device != "cuda":
        return {}
    return {"enforce_eager": not args.compile, "diffusion_compile_dynamic": args.compile_dynamic == "true"}


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


async def time_rounds(
    modes: dict, cfgs: list[float], repeats: int, stat: str = "mean"
) -> dict[tuple[str, float], float]:
    """Warm every (mode, cfg) once, then alternate them round by round; seconds per round, averaged (``stat``
    ``"median"``: the median round, which a machine shared with other jobs disturbs less than the mean)."""
    for name, run in modes.items():
        for cfg in cfgs:
            await run(cfg, 0)
            logger.info("warmed %s cfg=%g", name, cfg)
    elapsed = {(name, cfg): [] for name in modes for cfg in cfgs}
    for r in range(1, repeats + 1):
        for (name, cfg), rounds in elapsed.items():
            start = time.perf_counter()
            await modes[name](cfg, r)
            rounds.append(time.perf_counter() - start)
            logger.info("%s cfg=%g round %d: %.3f s", name, cfg, r, rounds[-1])
    average = statistics.median if stat == "median" else statistics.mean
    return {key: average(rounds) for key, rounds in elapsed.items()}


async def time_log_prob_engine(args, model_path: Path, pipeline: str | None, max_seqs: int, modes) -> dict:
    from transformers import Qwen2Tokenizer

    from verl_omni.pipelines.qwen_image.rollout_request import prompt_token_ids
    from verl_omni.workers.rollout.vllm_omni.engine import OmniRolloutEngine

    tokenizer = Qwen2Tokenizer.from_pretrained(model_path, subfolder="tokenizer")
    ids, neg = prompt_token_ids(tokenizer, PROMPT), prompt_token_ids(tokenizer, NEGATIVE)
    extra = {"custom_pipeline": pipeline} if pipeline else {}
    profiled = args.profile and "batched" in modes
    engine = OmniRolloutEngine(
        str(model_path),
        dtype=args.dtype,
        max_batch_requests=max_seqs,
        **extra,
        **engine_kwargs(args),
        **(profiler_kwargs(args, "batched") if profiled else {}),
    )
    start = time.perf_counter()
    engine.start()
    logger.info("log-prob engine (max_num_seqs=%d) started in %.1f s", max_seqs, time.perf_counter() - start)

    def negative(cfg):
        return neg if cfg > 1 else None

    async def singles(cfg, r, thin=False):
        calls = [
            engine.engine_call(ids, sampling(args, cfg, 1000 * r + i, thin), f"s{cfg}-{r}-{i}-{thin}", 1, negative(cfg))
            for i in range(args.n)
        ]
        await asyncio.gather(*calls)

    async def batched(cfg, r, thin=False, lora=None):
        calls = [
            engine.engine_call(
                ids,
                sampling(args, cfg, 1000 * r + 100 * k, thin),
                f"b{cfg}-{r}-{k}-{thin}-{lora is not None}",
                args.n,
                negative(cfg),
                lora_request=lora,
            )
            for k in range(args.requests)
        ]
        await asyncio.gather(*calls)

    runs = {"concurrent": singles, "serial": singles, "batched": batched}
    if args.thin:
        # the same seeds with the thinned ODE, alternating with the plain rounds on this engine
        runs |= {f"{m}_thin": functools.partial(runs[m], thin=True) for m in ("concurrent", "batched")}
        modes = [name for m in modes for name in (m, f"{m}_thin") if name in runs]
    try:
        if args.lora_rank and "batched" in modes:
            # the same seeds with the adapter, alternating with the plain rounds on this engine
            runs["batched_lora"] = functools.partial(batched, lora=await push_lora(args, engine, model_path))
            modes.insert(modes.index("batched") + 1, "batched_lora")
        seconds = await time_rounds({m: runs[m] for m in modes}, args.cfg, args.repeats, args.stat)
        logger.info("requests per transformer batch: %s", (await engine.request_batch_sizes())[-8:])
        if profiled:
            cfg = args.cfg[-1]
            wall = await profiled_request(args, engine._require_engine(), "batched", lambda: batched(cfg, 0))
            logger.info("profiled batched cfg=%g request: %.3f s (tables under %s)", cfg, wall, args.out)
        return seconds
    finally:
        engine.shutdown()


async def push_lora(args, engine, model_path: Path):
    """Push the seeded random recipe LoRA (module docstring) as the trainer's host sync does; returns its tensor-free
    request for the ``batched_lora`` rounds and leaves no adapter active for the others."""
    from weight_sync import recipe_lora

    config, tensors = recipe_lora(model_path, args.lora_rank, args.lora_alpha, torch.device(args.device))
    start = time.perf_counter()
    bound = await engine.load_lora_tensors(config, tensors)
    logger.info(
        "LoRA r=%d alpha=%g pushed in %.2f s, bound to %d layers",
        args.lora_rank,
        args.lora_alpha,
        time.perf_counter() - start,
        len(bound),
    )
    lora, engine.active_lora = engine.active_lora, None
    return lora


async def time_stock_engine(args, model_path: Path, pipeline: str | None) -> dict:
    from vllm_omni.entrypoints.async_omni import AsyncOmni
    from vllm_omni.inputs.data import OmniDiffusionSamplingParams

    from verl_omni.workers.rollout.vllm_omni.engine import DEFAULT_BATCH_WAIT_MS

    extra = {"custom_pipeline_args": {"pipeline_class": pipeline}} if pipeline else {}
    # the rollout engine's request-admission wait too: the comparison is of pipelines, not of admission
    extra["request_batch_max_wait_ms"] = DEFAULT_BATCH_WAIT_MS
    engine = AsyncOmni(model=str(model_path), dtype=args.dtype, max_num_seqs=args.n, **extra, **engine_kwargs(args))
    logger.info("stock engine started")

    async def one_request(cfg, r):
        params = OmniDiffusionSamplingParams(
            height=args.size,
            width=args.size,
            num_inference_steps=args.steps,
            num_outputs_per_prompt=args.n,
            true_cfg_scale=cfg,
            seed=r,
        )
        prompt = {"prompt": PROMPT, **({"negative_prompt": NEGATIVE} if cfg > 1 else {})}
        async for _ in engine.generate(prompt=prompt, request_id=f"stock{cfg}-{r}", sampling_params_list=[params]):
            pass

    try:
        return await time_rounds({"stock": one_request}, args.cfg, args.repeats, args.stat)
    finally:
        engine.shutdown()


def build_diffusers_pipeline(args, model_path: Path):
    from diffusers import QwenImagePipeline

    dtype = torch.float32 if args.dtype == "float32" else torch.bfloat16
    if not args.full_size:
        return QwenImagePipeline.from_pretrained(model_path, torch_dtype=dtype).to(args.device)
    from random_weights import build_diffusers_transformer

    transformer = build_diffusers_transformer(model_path, args.device, dtype)
    return QwenImagePipeline.from_pretrained(model_path, transformer=transformer, torch_dtype=dtype).to(args.device)


def time_diffusers(args, model_path: Path) -> dict:
    pipe = build_diffusers_pipeline(args, model_path)
    pipe.set_progress_bar_config(disable=True)

    async def run(cfg, r):
        pipe(
            prompt=PROMPT,
            negative_prompt=NEGATIVE if cfg > 1 else None,
            true_cfg_scale=cfg,
            height=args.size,
            width=args.size,
            num_inference_steps=args.steps,
            num_images_per_prompt=args.n,
            generator=torch.Generator(args.device).manual_seed(r),
        )
        if args.device == "cuda":
            torch.cuda.synchronize()

    return asyncio.run(time_rounds({"diffusers": run}, args.cfg, args.repeats, args.stat))


def transformer_tflop_per_image(args, model_path: Path) -> dict[str, float]:
    """TFLOPs of one transformer forward for one image (no CFG), counted on a meta-device copy, by class: ``matmul``
    (the linear layers' ``addmm``/``mm``), ``attention`` (on the meta device attention runs as its math form, whose
    two ``bmm`` are QKᵀ and PV; the transformer has no other ``bmm``) and ``other``."""
    from diffusers import QwenImageTransformer2DModel
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import Qwen2Tokenizer

    from verl_omni.pipelines.qwen_image.rollout_request import QWEN_IMAGE_PROMPT_DROP_TOKENS, prompt_token_ids

    tokenizer = Qwen2Tokenizer.from_pretrained(model_path, subfolder="tokenizer")
    text_len = len(prompt_token_ids(tokenizer, PROMPT)) - QWEN_IMAGE_PROMPT_DROP_TOKENS
    config = QwenImageTransformer2DModel.load_config(model_path / "transformer")
    with torch.device("meta"):
        model = QwenImageTransformer2DModel.from_config(config)
        side = args.size // 16  # VAE /8, then 2x2 patches
        hidden = torch.zeros(1, side * side, model.config.in_channels)
        text = torch.zeros(1, text_len, model.config.joint_attention_dim)
        mask = torch.ones(1, text_len, dtype=torch.long)
        timestep = torch.ones(1)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(hidden, text, mask, timestep, img_shapes=[(1, side, side)], return_dict=False)
    by_class = {"matmul": 0.0, "attention": 0.0, "other": 0.0}
    for op, flops in counter.get_flop_counts()["Global"].items():
        name = str(op)
        label = "attention" if name.endswith(".bmm") else "matmul" if name.endswith(("mm", "addmm")) else "other"
        by_class[label] += flops / 1e12
    return by_class


def kernel_breakdown(args, tflop_by_class: dict[str, float], ceiling: float) -> dict:
    """The profiled batched request's GPU time by kernel class, and its matmuls' and attention's TFLOP/s."""
    from kernel_profile import achieved, load_events, summarize

    trace = profile_folder(args, "batched").parent / "batched_trace.json.gz"
    summary = summarize(load_events(trace))
    cfg = args.cfg[-1]
    forwards = args.n * args.requests * model_calls(args, "batched") * (2 if cfg > 1 else 1)
    work = {label: tflop_by_class[label] * forwards for label in ("matmul", "attention")}
    summary["achieved"] = achieved(summary, work, ceiling)
    for label, seconds in sorted(summary["kernel_s"].items(), key=lambda kv: -kv[1]):
        rate = summary["achieved"].get(label)
        logger.info(
            "profile: %-11s %.3f s (%.1f%% of the GPU span)%s",
            label,
            seconds,
            100 * summary["share_of_span"][label],
            f", {rate['tflops']:.0f} TFLOP/s = {100 * rate['fraction_of_ceiling']:.1f}% of the ceiling" if rate else "",
        )
    logger.info("profile: GPU span %.3f s, idle %.3f s", summary["gpu_span_s"], summary["idle_s"])
    return summary


def build_model(args, workdir: Path) -> Path:
    if args.model_path:
        return Path(args.model_path)
    if args.full_size:
        from random_weights import write_full_size_model_dir

        return write_full_size_model_dir(workdir / "qwen_image_full")
    from verl_omni.utils.tiny_models import build_tiny_model

    return Path(build_tiny_model("qwen_image", workdir / "tiny_qwen_image", seed=0))


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--full-size", action="store_true", help="real architecture, random bf16 weights (CUDA)")
    parser.add_argument("--model-path", help="an existing diffusers Qwen-Image directory")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--cfg", type=float, nargs="+", default=[1.0, 4.0], help="true-CFG scales (1 = off)")
    parser.add_argument("--n", type=int, default=4, help="images per prompt")
    parser.add_argument("--steps", type=int, help="denoising steps (default 8 on CPU, 50 full size)")
    parser.add_argument("--size", type=int, help="image side (default 64 on CPU, 512 full size)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--stat", choices=("mean", "median"), default="mean", help="seconds per round over repeats")
    parser.add_argument("--requests", type=int, default=1, help="batched: concurrent generate_batched(N) calls")
    parser.add_argument("--compile", action="store_true", help="CUDA: let the engines torch.compile (slow start)")
    parser.add_argument(
        "--compile-dynamic",
        choices=("true", "false"),
        default="true",
        help="with --compile: vLLM-Omni's diffusion_compile_dynamic (true, its default: every size symbolic)",
    )
    parser.add_argument("--window-range", type=int, nargs=2, metavar=("R0", "R1"), help="sde_window_range")
    parser.add_argument(
        "--thin",
        type=float,
        help="also time the ODE after R1 thinned to this ode_post_window_ratio with dpmsolver++ (needs --window-range)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="after the timed rounds, one more batched request (the last --cfg) under the engine's torch profiler "
        "(the worker's ops, CPU and CUDA): its table and trace under profile/ next to --out",
    )
    parser.add_argument(
        "--lora-rank",
        type=int,
        help="also time a batched_lora row: the batched requests with a random LoRA of this rank on the recipe's "
        "target modules, loaded in memory (its FLOP fraction counts the base transformer's FLOPs only)",
    )
    parser.add_argument("--lora-alpha", type=float, help="the LoRA's alpha (default 2 x --lora-rank)")
    parser.add_argument("--out", help="also write the JSON result here")
    args = parser.parse_args(argv)
    if args.profile and not (args.out and "batched" in args.modes):
        parser.error("--profile profiles a batched request and writes next to the JSON: pass --out and mode batched")
    if args.lora_rank is not None:
        if args.lora_rank < 1 or "batched" not in args.modes:
            parser.error("--lora-rank R (R >= 1) adds a row beside the batched mode: pass --modes batched")
        args.lora_alpha = args.lora_alpha or 2 * args.lora_rank
    if args.full_size and args.device != "cuda":
        parser.error("--full-size needs --device cuda (the transformer alone is ~40 GB in bf16)")
    args.steps = args.steps or (50 if args.full_size else 8)
    args.size = args.size or (512 if args.full_size else 64)
    args.dtype = "float32" if args.device == "cpu" else "bfloat16"
    if args.requests < 1 or args.requests > args.n:
        parser.error(f"--requests must be in [1, --n={args.n}] (the engine batches at most N requests)")
    if args.requests > 1 and set(args.modes) != {"batched"}:
        parser.error("--requests applies to the batched mode only: pass --modes batched")
    if args.thin is not None:
        from verl_omni.pipelines.sampling import SamplingSpec

        if not args.window_range:
            parser.error("--thin needs --window-range R0 R1 (the ODE is thinned after R1)")
        try:
            values = sampling(args, 1.0, 0, thin=True)
            SamplingSpec(**{k: v for k, v in values.items() if k != "seed"})
        except ValueError as error:
            parser.error(f"--thin {args.thin} --window-range {args.window_range}: {error}")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    # the engines import the random-weight pipelines by name in their own processes
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    sys.path.insert(0, str(HERE))
    log_prob_pipeline = stock_pipeline = None
    if args.full_size:
        from random_pipelines import LOG_PROB_PIPELINE, STOCK_PIPELINE

        log_prob_pipeline, stock_pipeline = LOG_PROB_PIPELINE, STOCK_PIPELINE
    seconds: dict[tuple[str, float], float] = {}
    with tempfile.TemporaryDirectory(prefix="rollout_bench_") as tmp:
        model_path = build_model(args, Path(tmp))
        shared = [m for m in ("concurrent", "batched") if m in args.modes]
        if shared:
            seconds |= asyncio.run(time_log_prob_engine(args, model_path, log_prob_pipeline, args.n, shared))
        if "serial" in args.modes:
            seconds |= asyncio.run(time_log_prob_engine(args, model_path, log_prob_pipeline, 1, ["serial"]))
        if "stock" in args.modes:
            seconds |= asyncio.run(time_stock_engine(args, model_path, stock_pipeline))
        if "diffusers" in args.modes:
            seconds |= time_diffusers(args, model_path)
        tflop_by_class = transformer_tflop_per_image(args, model_path)
    tflop = sum(tflop_by_class.values())
    dtype = torch.float32 if args.dtype == "float32" else torch.bfloat16
    ceiling = matmul_ceiling_tflops(torch.device(args.device), dtype, 8192 if args.device == "cuda" else 1024)
    rows = []
    for (mode, cfg), secs in seconds.items():
        img_s = args.n * args.requests / secs
        calls = model_calls(args, mode)
        limit = ceiling / (tflop * calls * (2 if cfg > 1 else 1))
        row = {"mode": mode, "cfg": cfg, "img_s": round(img_s, 4), "fraction_of_limit": round(img_s / limit, 4)}
        rows.append(row | {"model_calls": calls})
        logger.info(
            "%-10s cfg=%g: %.4g img/s (%.1f%% of the %.3g img/s FLOP limit)",
            mode,
            cfg,
            img_s,
            100 * img_s / limit,
            limit,
        )
    result = {
        "rows": rows,
        "n": args.n,
        "requests": args.requests,
        "steps": args.steps,
        "stat": args.stat,
        "size": args.size,
        "lora": {"rank": args.lora_rank, "alpha": args.lora_alpha} if args.lora_rank else None,
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "transformer_tflop_per_image_step": round(tflop, 3),
        "transformer_tflop_by_class": {label: round(value, 3) for label, value in tflop_by_class.items()},
        "matmul_ceiling_tflops": round(ceiling, 1),
    }
    if args.profile and args.device == "cuda":  # a CPU trace has no kernels to class
        result["profile"] = kernel_breakdown(args, tflop_by_class, ceiling)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()

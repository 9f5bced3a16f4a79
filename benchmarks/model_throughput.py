"""One model on one device: our rollout pipeline vs stock vLLM-Omni's, and the actor's LoRA replay.

``--model``: ``sd3`` (SD3.5 Medium), ``flux2`` (FLUX.2-dev, 32 B), ``flux2_klein`` (FLUX.2-klein 4B,
step-distilled; stock vLLM-Omni 0.26 does not start it, so ours is timed alone), ``wan2_2`` (Wan2.2 TI2V-5B
text-to-video), ``wan2_2_a14b`` / ``wan2_2_i2v_a14b`` (Wan2.2 T2V-A14B / I2V-A14B, replay only),
``hunyuan_video_1_5`` (HunyuanVideo-1.5 480p text-to-video), ``ltx2`` (LTX-2, video with its audio as one latent)
or ``qwen_image_edit`` (rollout only); what differs between them is in ``bench_models.py`` (the replay's recorded
batches in ``bench_replay_batches.py``). One run, two parts:

* **rollout**: N samples of one prompt per request at the model's recipe sampling (SD3.5: 512², 10 steps,
  CFG 4.5; Wan2.2: 832×480, 33 frames, 10 steps, CFG 5; the others' at their entries; Qwen-Image-Edit: 512², one
  source image conditioned at vLLM-Omni's 1024² (``--condition-area``), 10 steps, true CFG 4): our log-prob pipeline
  (``OmniRolloutEngine``, one ``generate_batched(N)`` request, SDE window 2, noise 0.7) and vLLM-Omni's own
  pipeline (one request with ``num_outputs_per_prompt=N``). Each engine is warmed once, then timed over
  ``--repeats`` requests; the ratio ours / stock is printed (the target is >= 0.99);
* **replay** (all but Qwen-Image-Edit; the A14B: both experts in one module, a row per expert at a step it
  sampled): the actor's unit of work (one recorded transition: velocity with the model's guidance,
  SDE step, log-prob, backward into a LoRA of the recipe's rank; gradient checkpointing on, as the engine's
  default), samples/s, seconds per sample and peak GPU memory per micro-batch, and its TFLOP/s as a
  fraction of the measured matmul ceiling (``actor_throughput.py``'s loop). Its FLOPs are counted on one more
  step on the device; where that count runs out of memory (or with ``--meta-flop-count``), on ``meta`` (below);
* **flops** (not run by default; no GPU needed, ``--full-size`` included): the FLOPs of one replayed sample, counted
  with the module on the ``meta`` device (``meta_flops.py``: shapes only, no memory), per expert, and per step of
  each micro-batch. It is a CUDA device's own count (equal on FLUX.2-dev), for a replay whose count could not run
  there (a CPU's count of real tensors leaves out its fused attention kernel, which has no FLOP formula).

Full size (``--full-size``, CUDA): the released transformer architecture and VAE with random bf16 weights
(``random_weights.py``: no weight file; the tiny text encoders), the replay on the released architecture with
its released text width. Without it: the tiny random model on whatever device is present, fp32, a few steps,
an editing model's source image conditioned at 96×64: the smoke mode the CPU test runs. The last stdout line is
one JSON object, also written to ``$OUT/<model>_throughput.json`` when ``OUT`` is set (or to ``--out``).

    python benchmarks/model_throughput.py --full-size                  # SD3.5 Medium on an H100/H200
    python benchmarks/model_throughput.py --model wan2_2 --full-size   # Wan2.2 TI2V-5B, 832x480x33
    python benchmarks/model_throughput.py --model wan2_2               # CPU smoke run (tiny model)
    python benchmarks/model_throughput.py --model wan2_2_a14b --full-size --parts replay  # A14B, 832x480x33
    python benchmarks/model_throughput.py --model wan2_2 --full-size --parts rollout --frames 81 --ulysses 1 2
    python benchmarks/model_throughput.py --model hunyuan_video_1_5 --full-size --frames 121  # the launcher's video
    python benchmarks/model_throughput.py --model hunyuan_video_1_5 --full-size --parts flops  # on a CPU too

``--ulysses 1 2`` times the rollout part at each sequence-parallel degree (both engines split alike over that many
GPUs): ours / stock per degree, and each degree's speed-up per GPU over the first.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
from bench_models import (  # noqa: E402
    FULL_SIZE_VAE_SCALE,
    MODELS,
    PROMPT,
    REPLAY_TEXT_LEN,
    build_replay_model,
)
from bench_replay_batches import replay_batch_fn  # noqa: E402
from rollout_throughput import engine_kwargs, profiled_request, profiler_kwargs, time_rounds  # noqa: E402

logger = logging.getLogger("model_throughput")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(MODELS), default="sd3")
    p.add_argument("--full-size", action="store_true", help="released architecture, random bf16 weights, CUDA")
    p.add_argument(
        "--parts", nargs="+", choices=("rollout", "replay", "flops"), help="default: rollout and replay (the model's)"
    )
    p.add_argument("--n", type=int, help="samples per prompt (one request; default the model's)")
    p.add_argument("--steps", type=int, help="denoising steps (default the model's)")
    p.add_argument("--size", help="HxW or a square side in pixels (default the model's)")
    p.add_argument(
        "--frames", type=int, help="video frames (Wan2.2, HunyuanVideo-1.5: 4k + 1; LTX-2: 8k + 1; default the model's)"
    )
    p.add_argument(
        "--condition-area",
        type=int,
        help="editing models: pixels of the source image as both engines condition on it, at its aspect ratio "
        "(default: vLLM-Omni's fixed 1024² at full size, 96x64 in the smoke mode)",
    )
    p.add_argument("--repeats", type=int, default=3, help="timed requests per engine")
    p.add_argument(
        "--ulysses",
        type=int,
        nargs="+",
        default=[1],
        help="rollout: the sequence-parallel degrees to time, both engines split alike (vLLM-Omni's ulysses_degree: "
        "that many GPUs per engine, or worker processes on the CPU), e.g. 1 2",
    )
    p.add_argument("--micro-batches", type=int, nargs="+", help="replay micro-batches (default the model's)")
    p.add_argument("--warmup", type=int, default=2, help="replay warm-up iterations")
    p.add_argument("--iters", type=int, default=5, help="replay timed iterations")
    p.add_argument("--no-gradient-checkpointing", action="store_true", help="replay without recomputing blocks")
    p.add_argument(
        "--no-flop-count", action="store_true", help="replay: skip the extra FLOP-counting step (no TFLOP/s)"
    )
    p.add_argument(
        "--meta-flop-count",
        action="store_true",
        help="replay: count the FLOPs on the meta device (meta_flops.py) instead of in an extra step on the device",
    )
    p.add_argument("--compile", action="store_true", help="CUDA: let the engines torch.compile (slow start)")
    p.add_argument(
        "--profile",
        action="store_true",
        help="after the timed requests, one more of each engine under the engine's torch profiler (worker ops, "
        "CPU and CUDA): its tables under $OUT/profile/{ours,stock} and the request's wall split in the JSON",
    )
    p.add_argument("--out", help="write the JSON result here (default $OUT/<model>_throughput.json when OUT is set)")
    args = p.parse_args(argv)
    args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.full_size and args.device != "cuda" and args.parts != ["flops"]:
        p.error("--full-size needs a CUDA device (but for --parts flops)")
    model = MODELS[args.model]
    defaults = model.full if args.full_size else model.tiny
    if args.size:
        height, _, width = args.size.partition("x")
        args.height, args.width = int(height), int(width or height)
    else:
        args.height, args.width = defaults["height"], defaults["width"]
    args.frames = args.frames or defaults["frames"]
    args.steps = args.steps or defaults["steps"]
    args.n = args.n or defaults["n"]
    args.micro_batches = args.micro_batches or defaults["micro_batches"]
    if args.condition_area is not None and not model.source_images:
        p.error(f"--condition-area: --model {args.model} takes no source image")
    args.condition_area = args.condition_area or defaults.get("condition_area")
    args.parts = args.parts or [part for part, has in (("rollout", model.rollout), ("replay", model.lora)) if has]
    if {"replay", "flops"} & set(args.parts) and not model.lora:
        p.error(f"--model {args.model} has no replay part here (rollout only)")
    if "rollout" in args.parts and not model.rollout:
        p.error(f"--model {args.model} has no rollout part here (--parts replay)")
    if any(degree < 1 for degree in args.ulysses):
        p.error(f"--ulysses: degrees are >= 1, got {args.ulysses}")
    if args.device == "cuda" and max(args.ulysses) > torch.cuda.device_count():
        p.error(f"--ulysses {max(args.ulysses)} needs as many GPUs, {torch.cuda.device_count()} visible")
    args.dtype = "bfloat16" if args.full_size else "float32"
    if args.out is None and os.environ.get("OUT"):
        args.out = str(Path(os.environ["OUT"]) / f"{args.model}_throughput.json")
    if args.profile and not args.out:
        p.error("--profile writes its tables next to the JSON: set OUT or --out")
    # rollout_throughput's helpers read these
    args.cfg, args.requests = [model.cfg], 1
    args.profiled = {}
    return args


def split_kwargs(degree: int) -> dict:
    """An engine's sequence split over ``degree`` ranks (none at 1: the engine's own default)."""
    return {"ulysses_degree": degree} if degree > 1 else {}


async def time_ours(args, model_path: Path, pipeline: str | None, degree: int = 1) -> float:
    """Seconds per ``generate_batched(N)`` request of our log-prob pipeline (the model's negative prompt, if any)."""
    from transformers import AutoTokenizer

    from verl_omni.workers.rollout.vllm_omni.engine import OmniRolloutEngine

    model = MODELS[args.model]
    adapter = model.load_adapter()
    tokenizer = AutoTokenizer.from_pretrained(model_path, subfolder=adapter.tokenizer_subfolder)
    ids = adapter.prompt_token_ids(tokenizer, PROMPT)
    negative = None if model.negative is None else adapter.prompt_token_ids(tokenizer, model.negative)
    images = model.images()
    warmup = None if args.full_size else (args.height, args.width)
    engine = OmniRolloutEngine(
        str(model_path),
        dtype=args.dtype,
        max_batch_requests=1,
        custom_pipeline=pipeline,
        warmup_size=warmup,
        **engine_kwargs(args),
        **split_kwargs(degree),
        **profiler_kwargs(args, "ours"),
    )
    engine.start()
    cfg = model.cfg

    async def one(_cfg, r):
        params = model.ours_sampling(args, 1000 * r)
        outs = await engine.engine_call(ids, params, f"ours-{r}", args.n, negative, image_data=images)
        assert len(outs) == args.n

    try:
        seconds = (await time_rounds({"ours": one}, args.cfg, args.repeats))["ours", cfg]
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
        wall = await profiled_request(args, engine._require_engine(), "ours", lambda: one(None, args.repeats + 1))
    finally:
        engine_module.unpack_request_output = unpack
    return {"request_s": wall, "client_unpack_s": sum(unpack_s)}


async def time_stock(args, model_path: Path, pipeline: str | None, degree: int = 1) -> float:
    """Seconds per request of vLLM-Omni's pipeline with ``num_outputs_per_prompt=N`` (the same prompt, CFG and
    source image as ours; a pipeline that makes one sample a request: N requests in a row)."""
    from vllm_omni.entrypoints.async_omni import AsyncOmni

    from verl_omni.workers.rollout.vllm_omni.engine import DEFAULT_BATCH_WAIT_MS

    model = MODELS[args.model]
    extra = {"custom_pipeline_args": {"pipeline_class": pipeline}} if pipeline else {}
    if args.device == "cpu":
        # the CPU platform's warm-up at the timed size, as our engine's (not vLLM-Omni's 512²)
        from verl_omni.platforms.cpu_patches import engine_start_config
        from verl_omni.workers.rollout.vllm_omni.engine import DEFAULT_ENGINE_START_TIMEOUT_S

        size = (args.height, args.width)
        extra["additional_config"] = engine_start_config(size, DEFAULT_ENGINE_START_TIMEOUT_S, "model_throughput stock")
    # the rollout engine's admission wait too: the comparison is of pipelines, not of admission
    engine = AsyncOmni(
        model=str(model_path),
        dtype=args.dtype,
        max_num_seqs=1,
        request_batch_max_wait_ms=DEFAULT_BATCH_WAIT_MS,
        **extra,
        **engine_kwargs(args),
        **split_kwargs(degree),
        **profiler_kwargs(args, "stock"),
    )
    prompt = model.stock_prompt()

    async def one(_cfg, r):
        for i in range(model.stock_requests(args)):
            params = model.stock_params(args, 1000 * r + i)
            async for _ in engine.generate(prompt=prompt, request_id=f"stock-{r}-{i}", sampling_params_list=[params]):
                pass

    try:
        seconds = (await time_rounds({"stock": one}, args.cfg, args.repeats))["stock", model.cfg]
        if args.profile:
            wall = await profiled_request(args, engine, "stock", lambda: one(None, args.repeats + 1))
            args.profiled["stock"] = {"request_s": wall}
        return seconds
    finally:
        engine.shutdown()


@contextlib.contextmanager
def condition_area(args):
    """Both engines' source images at ``args.condition_area`` pixels (None: vLLM-Omni's fixed 1024², untouched).

    Ours reads it from the request (``model_kwargs``); the stock pre-process has no setting for it, so it is
    overridden in this process, where both engines pre-process their requests (the warm-ups' too), for as long
    as they run. A vLLM-Omni on which that override is not known to work stops the run rather than compare the
    two pipelines at different areas."""
    if args.condition_area is None:
        yield
        return
    from verl_omni.utils.vllm_omni_compat import qwen_image_edit_condition_area

    with qwen_image_edit_condition_area(args.condition_area) as in_place:
        if not in_place:
            raise SystemExit("--condition-area: the stock pipeline's area cannot be set on this vLLM-Omni (above)")
        yield


def rollout_part(args, model_path: Path) -> dict:
    """Ours against stock at each ``--ulysses`` degree; with several degrees, each one's rows also say its speed-up
    per GPU over the first degree's (the same engine on fewer GPUs)."""
    ours_pipeline = stock_pipeline = None
    if args.full_size:
        ours_pipeline, stock_pipeline = MODELS[args.model].pipelines()
    rows = []
    with condition_area(args):
        for degree in args.ulysses:
            ours = asyncio.run(time_ours(args, model_path, ours_pipeline, degree))
            row = {"ulysses_degree": degree, "ours_per_s": args.n / ours, "ours_request_s": ours}
            if MODELS[args.model].stock_starts:
                stock = asyncio.run(time_stock(args, model_path, stock_pipeline, degree))
                row |= {"stock_per_s": args.n / stock, "ratio_ours_to_stock": stock / ours, "stock_request_s": stock}
            if rows:
                base = rows[0]
                per_gpu = row["ours_per_s"] / degree / (base["ours_per_s"] / base["ulysses_degree"])
                row["ours_speedup"], row["ours_per_gpu_vs_first"] = row["ours_per_s"] / base["ours_per_s"], per_gpu
            rows.append(row)
            stock = "not started (see bench_models)"
            if "stock_per_s" in row:
                stock = f"{row['stock_per_s']:.4g}/s, ours/stock {row['ratio_ours_to_stock']:.4f}"
            logger.info(
                "rollout, %d samples of one prompt, ulysses %d: ours %.4g/s, stock %s",
                args.n,
                degree,
                row["ours_per_s"],
                stock,
            )
    # one degree: its row is the result, as before the split was timed
    result = rows[0] if len(rows) == 1 else {"rows": rows}
    if args.profile:
        result["profiled_request"] = args.profiled
    return result


def replay_setting(args, model_path: Path):
    """The replay's sampling spec, scheduler and pixels per latent cell (and ``args.text_len``, the batches')."""
    from verl_omni.pipelines.sampling import SamplingSpec

    model = MODELS[args.model]
    adapter = model.load_adapter()
    spec = SamplingSpec(
        num_inference_steps=args.steps,
        height=args.height,
        width=args.width,
        num_frames=args.frames,
        noise_level=0.7,
        true_cfg_scale=model.cfg,
    )
    scheduler = adapter.build_scheduler(model_path)
    vae_scale = FULL_SIZE_VAE_SCALE[args.model] if args.full_size else adapter.vae_scale_factor(model_path)
    args.text_len = REPLAY_TEXT_LEN[args.model]
    return spec, scheduler, vae_scale


def meta_flops_per_sample(args, model_path: Path) -> dict:
    """FLOPs of one replayed sample, per expert (``None``: the one transformer), counted with the replay's module
    and batches on the ``meta`` device (``meta_flops.py``); kept on ``args``, counted once a run."""
    if getattr(args, "meta_flops", None) is None:
        from meta_flops import META, count_replay_flops, meta_batch

        model = MODELS[args.model]
        adapter = model.load_adapter()
        spec, scheduler, vae_scale = replay_setting(args, model_path)
        module = build_replay_model(model, args, model_path, META, torch.float32)
        args.meta_flops = {}
        for expert in model.experts or (None,):
            batch = meta_batch(replay_batch_fn(model, args, expert), module, spec, args.text_len, vae_scale, scheduler)
            args.meta_flops[expert] = count_replay_flops(module, scheduler, batch, spec, vae_scale, adapter)
            logger.info(
                "FLOPs of one replayed sample%s, counted on meta: %d",
                f" ({expert})" if expert else "",
                args.meta_flops[expert],
            )
    return args.meta_flops


def flops_part(args, model_path: Path) -> dict:
    """The FLOPs of one replayed sample (per expert) and of a step of each micro-batch, counted on ``meta``."""
    per_sample = meta_flops_per_sample(args, model_path)
    rows = [
        {"micro_batch": mb, "flops_per_sample": flops, "flops": mb * flops} | ({"expert": expert} if expert else {})
        for mb in args.micro_batches
        for expert, flops in per_sample.items()
    ]
    return {"counted_on": "meta", "rows": rows}


def replay_part(args, model_path: Path) -> dict:
    model = MODELS[args.model]
    adapter = model.load_adapter()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.full_size else torch.float32
    spec, scheduler, vae_scale = replay_setting(args, model_path)
    module = build_replay_model(model, args, model_path, device, dtype)
    ceiling = matmul_ceiling_tflops(device, dtype, 8192 if device.type == "cuda" else 1024)
    rows = []
    for micro_batch, expert in [(mb, e) for mb in args.micro_batches for e in model.experts or (None,)]:
        batch_fn = replay_batch_fn(model, args, expert)
        unit = f"micro-batch {micro_batch}" + (f", {expert}" if expert else "")
        try:
            row = measure(
                module,
                scheduler,
                spec,
                args,
                micro_batch,
                vae_scale,
                device,
                dtype,
                adapter,
                batch_fn,
                count=not (args.no_flop_count or args.meta_flop_count),
            )
        except torch.OutOfMemoryError as error:
            # the memory recipe's answer for this size: record it and go on with the next micro-batch
            logger.warning("replay %s: out of memory (%s)", unit, str(error).split("\n")[0])
            module.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            rows.append({"micro_batch": micro_batch, "out_of_memory": True} | ({"expert": expert} if expert else {}))
            continue
        if expert:
            row["expert"] = expert
        if row["flops"] is None and not args.no_flop_count:
            # the device's count ran out of memory (or was not asked for): the same count on meta
            row["flops"] = micro_batch * meta_flops_per_sample(args, model_path)[expert]
            row["tflops"], row["flops_counted_on"] = row["flops"] / row["step_s"] / 1e12, "meta"
        row["fraction_of_matmul_ceiling"] = None if row["tflops"] is None else row["tflops"] / ceiling
        row["s_per_sample"] = row["step_s"] / micro_batch
        rows.append(row)
        tflops = "no" if row["tflops"] is None else f"{row['tflops']:.4g}"
        fraction = "" if row["tflops"] is None else f" ({100 * row['fraction_of_matmul_ceiling']:.1f}% of the ceiling)"
        logger.info(
            "replay %s: %.4g samples/s (%.3f s/sample), %s TFLOP/s%s, matmul ceiling %.4g TFLOP/s, peak %s GB",
            unit,
            row["samples_per_s"],
            row["s_per_sample"],
            tflops,
            fraction,
            ceiling,
            None if row["peak_memory_gb"] is None else f"{row['peak_memory_gb']:.1f}",
        )
    rank, alpha = model.lora
    checkpointing = not args.no_gradient_checkpointing
    return {"matmul_ceiling_tflops": ceiling, "lora_rank": rank, "lora_alpha": alpha, "rows": rows} | {
        "gradient_checkpointing": checkpointing
    }


def main(argv=None) -> dict:
    args = parse_args(argv)
    # force: an import (vLLM's) configured the root logger first, which hid these progress lines
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", force=True)
    # the engines import the random-weight pipelines by name in their own processes
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    model = MODELS[args.model]
    result = {
        "model": f"{args.model} ({'full size, random weights' if args.full_size else 'tiny random'})",
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "n": args.n,
        "steps": args.steps,
        "height": args.height,
        "width": args.width,
        "frames": args.frames,
        "cfg": model.cfg,
    }
    if args.condition_area:
        result["condition_area"] = args.condition_area
    with tempfile.TemporaryDirectory(prefix=f"{args.model}_bench_") as tmp:
        if args.full_size:
            model_path = model.write_full_size_dir(Path(tmp) / args.model)
        else:
            from verl_omni.utils.tiny_models import build_tiny_model

            model_path = build_tiny_model(model.builder, Path(tmp) / f"tiny_{args.model}", seed=0)
        start = time.perf_counter()
        if "rollout" in args.parts:
            result["rollout"] = rollout_part(args, model_path)
        if "replay" in args.parts:
            result["replay"] = replay_part(args, model_path)
        if "flops" in args.parts:
            result["flops"] = flops_part(args, model_path)
        result["wall_s"] = round(time.perf_counter() - start, 1)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()

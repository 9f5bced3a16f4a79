"""The actor's replay split over a sequence-parallel group, against the same ranks replaying data-parallel.

Launched by ``torchrun``, one process per GPU (the ranks, the group and the sharding are torchrun's world):

    torchrun --nproc-per-node 2 benchmarks/sequence_parallel_replay.py --model wan2_2_a14b --frames 81 --sp 2
    torchrun --nproc-per-node 2 benchmarks/sequence_parallel_replay.py --model wan2_2_a14b --frames 81 --sp 1
    torchrun --nproc-per-node 2 benchmarks/sequence_parallel_replay.py --model wan2_2 \\
        --height 704 --width 1280 --frames 121 --sp 2
    torchrun --nproc-per-node 2 benchmarks/sequence_parallel_replay.py --smoke --model wan2_2_a14b --sp 2  # CPU

Every rank holds the trained module as the FSDP engine builds it (``verl_omni.workers.engine.fsdp.diffusers_impl``):
the full-size transformer (the A14B: both experts in one module) with random bf16 weights made on the GPU
(``bench_models.full_size_transformer``; no weight file), split over its sequence-parallel group by the adapter's
own ``enable_sequence_parallel`` on the engine's ``(dp, ring, ulysses)`` mesh, gradient checkpointing, the recipe's
LoRA (fp32 master weights), then FSDP2 over every rank with the engine's own helpers: bf16 compute, fp32 gradient
reduction, block inputs cast on recompute. ``--sp N`` on N ranks: one sample's tokens split over the N GPUs;
``--sp 1``: data parallel, each rank its own sample (the sharded base is what lets the A14B's two experts fit).

The timed unit is ``actor_throughput``'s: one recorded transition replayed (velocity with CFG's two passes, SDE
step, log-prob) and the backward of its log-prob into the LoRA, ``--micro-batch`` samples per rank group, a row
per expert at a step that expert sampled. Reported per row: seconds per sample, samples/s per GPU, each rank's
peak GPU memory (``torch.cuda.max_memory_allocated``) and, with ``--flop-count``, TFLOP/s per GPU as a fraction
of the measured bf16 matmul ceiling (one more step under ``torch.utils.flop_counter``; off by default, as the
counter may take SDPA's math path, which at 81 frames holds an L x L attention matrix). A row that runs out of
memory is recorded as such (every rank runs the same shapes, so all of them run out together; a rank left waiting
on a collective fails after ``COLLECTIVE_TIMEOUT`` instead of hanging). On an H200, set
``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` to keep fragmentation out of the peaks near the limit.

``--smoke``: the tiny random model in fp32 (gloo on CPU when there is no GPU): the run ``tests/benchmarks`` does.
Rank 0's last stdout line is one JSON object, also written to ``$OUT/<model>_sp<sp>_replay.json`` when ``OUT`` is
set (or to ``--out``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from actor_throughput import matmul_ceiling_tflops, measure  # noqa: E402
from bench_models import (  # noqa: E402
    FULL_SIZE_VAE_SCALE,
    MODELS,
    REPLAY_TEXT_LEN,
    build_replay_model,
)
from bench_replay_batches import replay_batch_fn  # noqa: E402

logger = logging.getLogger("sequence_parallel_replay")

# models whose replay the bench models carry and whose adapter can split a sequence
SPLITTABLE = ("wan2_2", "wan2_2_a14b")
# a collective left waiting this long means a rank died (e.g. out of memory alone): fail instead of hanging
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=4)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=SPLITTABLE, default="wan2_2_a14b")
    p.add_argument("--smoke", action="store_true", help="tiny random model, fp32, any device (the CPU test)")
    p.add_argument("--height", type=int, help="pixels (default the model's: 480 full size)")
    p.add_argument("--width", type=int, help="pixels (default the model's: 832 full size)")
    p.add_argument("--frames", type=int, help="video frames, 4k + 1 (default the model's)")
    p.add_argument("--steps", type=int, help="denoising steps of the recorded schedule (default the model's)")
    p.add_argument("--sp", type=int, default=None, help="sequence-parallel degree; divides the ranks (default all)")
    p.add_argument("--micro-batch", type=int, default=1, help="samples per replay call of a rank group")
    p.add_argument(
        "--experts",
        nargs="+",
        help="A14B: the experts replayed, a row each (default both; both stay resident, as the actor holds them)",
    )
    p.add_argument("--warmup", type=int, default=1, help="untimed replays before each row")
    p.add_argument("--iters", type=int, default=2, help="timed replays per row")
    p.add_argument("--no-gradient-checkpointing", action="store_true", help="keep every block's activations")
    p.add_argument("--flop-count", action="store_true", help="one more replay under the FLOP counter: TFLOP/s")
    p.add_argument("--out", help="the JSON result (default $OUT/<model>_sp<sp>_replay.json when OUT is set)")
    args = p.parse_args(argv)
    model = MODELS[args.model]
    defaults = model.tiny if args.smoke else model.full
    args.height = args.height or defaults["height"]
    args.width = args.width or defaults["width"]
    args.frames = args.frames or defaults["frames"]
    args.steps = args.steps or defaults["steps"]
    if (args.frames - 1) % 4:
        p.error(f"--frames {args.frames}: Wan2.2 takes 4k + 1 frames (e.g. 33, 49, 81, 121)")
    if args.micro_batch < 1:
        p.error(f"--micro-batch {args.micro_batch}: at least 1")
    args.experts = args.experts or list(model.experts)
    unknown = [e for e in args.experts if e not in model.experts]
    if unknown or (args.experts and not model.experts):
        p.error(f"--experts {args.experts}: --model {args.model} holds {list(model.experts) or 'one transformer'}")
    # what bench_models / actor_throughput read
    args.full_size = not args.smoke
    args.text_len = REPLAY_TEXT_LEN[args.model]
    return args


def init_ranks(args) -> torch.device:
    """The process group torchrun describes (NCCL with a GPU per rank, else gloo); checks ``--sp`` against it."""
    if "RANK" not in os.environ:
        raise SystemExit("launch with torchrun: torchrun --nproc-per-node N benchmarks/sequence_parallel_replay.py ...")
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    elif not args.smoke:
        raise SystemExit("full size needs a GPU per rank (the A14B's experts are 28 GB each in bf16); or --smoke")
    dist.init_process_group("nccl" if cuda else "gloo", timeout=COLLECTIVE_TIMEOUT)
    world = dist.get_world_size()
    args.sp = args.sp or world
    if args.sp < 1 or world % args.sp:
        raise SystemExit(f"--sp {args.sp} must divide the {world} ranks (--nproc-per-node)")
    return torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")


def model_dir(args, root: Path) -> Path:
    """Rank 0 writes the model directory (tiny model, or the full-size configs), the others read its path."""
    model = MODELS[args.model]
    path = [None]
    if dist.get_rank() == 0:
        if args.smoke:
            from verl_omni.utils.tiny_models import build_tiny_model

            path[0] = str(build_tiny_model(model.builder, root / f"tiny_{args.model}", seed=0))
        else:
            path[0] = str(model.write_full_size_dir(root / args.model))
    dist.broadcast_object_list(path, src=0)
    return Path(path[0])


def build_sharded_module(args, model_path: Path, device: torch.device, dtype: torch.dtype):
    """The trained module as the engine builds it: split over the group, checkpointing, LoRA, FSDP2 over all ranks."""
    from verl.utils.fsdp_utils import MixedPrecisionPolicy, apply_fsdp2
    from verl.workers.engine.fsdp.utils import create_device_mesh

    from verl_omni.pipelines.sequence_parallel import context_parallel_mesh
    from verl_omni.workers.engine.fsdp.idle_units import gather_every_unit_once
    from verl_omni.workers.engine.fsdp.recompute_cast import cast_inputs_on_recompute
    from verl_omni.workers.engine.fsdp.sequence_group import check_sequence_parallel

    model = MODELS[args.model]
    adapter = model.load_adapter()
    check_sequence_parallel(adapter, str(model_path), args.sp)
    split = None
    if args.sp > 1:
        mesh = context_parallel_mesh(device.type, args.sp)
        split = lambda module: adapter.enable_sequence_parallel(module, mesh)  # noqa: E731
    # every rank the same LoRA init, as the engine seeds it before sharding
    torch.manual_seed(7)
    module = build_replay_model(model, args, model_path, device, dtype, split=split)
    # the engine's precision: compute in the base's dtype (bf16 on a GPU), gradients reduced in fp32
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    fsdp_kwargs = {"mesh": create_device_mesh(dist.get_world_size(), -1), "mp_policy": policy}
    fsdp_kwargs["reshard_after_forward"] = True
    apply_fsdp2(module, fsdp_kwargs, {"wrap_policy": {"transformer_layer_cls_to_wrap": list(adapter.fsdp_wrap_blocks)}})
    if not args.no_gradient_checkpointing:
        cast_inputs_on_recompute(module, dtype)
    if dtype != torch.float32:
        gather_every_unit_once(module)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return module, adapter


def replay_rows(args, module, adapter, model_path: Path, device: torch.device, dtype: torch.dtype) -> list[dict]:
    """One timed row per expert (or one for a single transformer); each rank's own numbers."""
    from verl_omni.pipelines.sampling import SamplingSpec

    model = MODELS[args.model]
    spec = SamplingSpec(
        num_inference_steps=args.steps,
        height=args.height,
        width=args.width,
        num_frames=args.frames,
        noise_level=0.7,
        true_cfg_scale=model.cfg,
    )
    scheduler = adapter.build_scheduler(model_path)
    vae_scale = adapter.vae_scale_factor(model_path) if args.smoke else FULL_SIZE_VAE_SCALE[args.model]
    # the ranks of a group replay the same samples (their token slices); each group its own
    group = dist.get_rank() // args.sp
    rows = []
    for expert in args.experts or [None]:
        torch.manual_seed(1000 + group)
        try:
            row = measure(
                module,
                scheduler,
                spec,
                args,
                args.micro_batch,
                vae_scale,
                device,
                dtype,
                adapter,
                replay_batch_fn(model, args, expert),
                count=args.flop_count,
                autocast=False,
            )
        except torch.OutOfMemoryError as error:
            logger.warning("replay %s: out of memory (%s)", expert or "", str(error).split("\n")[0])
            module.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            row = {"micro_batch": args.micro_batch, "out_of_memory": True}
        rows.append(row | ({"expert": expert} if expert else {}))
    return rows


def combine(args, per_rank: list[list[dict]], ceiling: float) -> list[dict]:
    """Rank 0's table: per row, the slowest rank's step time, each rank's peak memory, throughput per GPU."""
    combined = []
    for i, first in enumerate(per_rank[0]):
        ranks = [rows[i] for rows in per_rank]
        row = {k: first[k] for k in ("micro_batch", "expert") if k in first}
        if any(r.get("out_of_memory") for r in ranks):
            combined.append(row | {"out_of_memory": True})
            continue
        step_s = max(r["step_s"] for r in ranks)
        row["step_s"] = step_s
        # a group finishes micro_batch samples per step; a GPU does 1/sp of them
        row["s_per_sample"] = step_s / args.micro_batch
        row["samples_per_s_per_gpu"] = args.micro_batch / (step_s * args.sp)
        peaks = [r["peak_memory_gb"] for r in ranks]
        row["peak_memory_gb_per_rank"] = peaks
        row["peak_memory_gb"] = None if None in peaks else max(peaks)
        if args.flop_count and all(r["flops"] is not None for r in ranks):
            # each rank counts its own share (its tokens, its heads): TFLOP/s per GPU
            row["tflops_per_gpu"] = sum(r["flops"] for r in ranks) / len(ranks) / step_s / 1e12
            row["fraction_of_matmul_ceiling"] = row["tflops_per_gpu"] / ceiling
        combined.append(row)
    return combined


def log_row(row: dict, sp: int) -> None:
    unit = f"sp {sp}" + (f", {row['expert']}" if "expert" in row else "")
    if row.get("out_of_memory"):
        logger.info("replay %s: out of memory", unit)
        return
    peak = "n/a" if row["peak_memory_gb"] is None else f"{row['peak_memory_gb']:.1f} GiB"
    tflops = row.get("tflops_per_gpu")
    logger.info(
        "replay %s: %.3f s/sample, %.4g samples/s/GPU, peak %s per rank%s",
        unit,
        row["s_per_sample"],
        row["samples_per_s_per_gpu"],
        peak,
        "" if tflops is None else f", {tflops:.4g} TFLOP/s/GPU ({100 * row['fraction_of_matmul_ceiling']:.1f}%)",
    )


def main(argv=None) -> dict | None:
    args = parse_args(argv)
    # force: an import may have configured the root logger already, and the rows are logged at INFO
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", force=True)
    device = init_ranks(args)
    if device.type == "cpu":
        torch.set_num_threads(1)
    dtype = torch.float32 if args.smoke else torch.bfloat16
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"{args.model}_sp_bench_") as tmp:
        model_path = model_dir(args, Path(tmp))
        module, adapter = build_sharded_module(args, model_path, device, dtype)
        build_s = time.perf_counter() - start
        ceiling = matmul_ceiling_tflops(device, dtype, 8192 if device.type == "cuda" else 512)
        rows = replay_rows(args, module, adapter, model_path, device, dtype)
        # every rank's rows reach rank 0 (which needs the directory's scheduler no longer)
        per_rank = [None] * dist.get_world_size()
        dist.all_gather_object(per_rank, rows)
    result = None
    if dist.get_rank() == 0:
        model = MODELS[args.model]
        rank, alpha = model.lora
        result = {
            "model": f"{args.model} ({'tiny random' if args.smoke else 'full size, random weights'})",
            "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "ranks": dist.get_world_size(),
            "sp": args.sp,
            "mode": "data parallel" if args.sp == 1 else f"sequence parallel over {args.sp} ranks",
            "height": args.height,
            "width": args.width,
            "frames": args.frames,
            "steps": args.steps,
            "cfg": model.cfg,
            "micro_batch": args.micro_batch,
            "lora_rank": rank,
            "lora_alpha": alpha,
            "gradient_checkpointing": not args.no_gradient_checkpointing,
            "dtype": str(dtype),
            "matmul_ceiling_tflops": ceiling,
            "build_s": round(build_s, 1),
            "rows": combine(args, per_rank, ceiling),
            "wall_s": round(time.perf_counter() - start, 1),
        }
        for row in result["rows"]:
            log_row(row, args.sp)
        out = args.out
        if out is None and os.environ.get("OUT"):
            out = str(Path(os.environ["OUT"]) / f"{args.model}_sp{args.sp}_replay.json")
        if out:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            Path(out).write_text(json.dumps(result, indent=2))
        print(json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return result


if __name__ == "__main__":
    main()

"""Weight sync into one rollout replica: host tensors against CUDA IPC or NCCL, side by side in one run.

What the trainer's sync phase does after each update (``verl_omni.workers.rollout.weight_sync``), minus Ray's
hops between the actor, the trainer and the server (the host path pays those on top, twice):

* ``lora_host``: the LoRA as host tensors through the engine's worker RPC (colocated runs before CUDA IPC; separate
  pools still);
* ``lora_ipc``: the LoRA packed on the GPU and opened by the worker through its CUDA IPC handle (``device_share``;
  colocated runs on CUDA now);
* ``full_ipc``: the whole transformer in ``--bucket-mb`` buckets by CUDA IPC (full fine-tuning, colocated);
* ``full_host``: the first ``--host-buckets`` buckets as host tensors (checksummed on the host, as CPU runs send
  them), reported per GB (the whole 40 GB would take minutes);
* ``full_nccl`` / ``lora_nccl``: the whole transformer in buckets, or the LoRA, broadcast over NCCL from this process
  on GPU 0 to the engine on GPU 1 (separate pools, ``collective_share``); these put the engine on GPU 1, so they
  run without the ``*_ipc`` modes (two GPUs).

The sender is this process, on the rollout's GPU as a colocated actor rank is (GPU 0 beside the rollout's GPU 1 for
the ``*_nccl`` modes); the receiver is the engine's
diffusion worker, which checks and loads every bucket (the full syncs come first: an engine that served a LoRA
refuses full weights). The LoRA is the recipe's (``run_qwen_image_ocr_lora.sh``: r64, alpha 128, the adapter's
targets) in the actor's fp32, random; the transformer's tensors are random bf16, made one bucket at a time
outside the timed part. Rows: seconds per sync (median of ``--repeats``), GB moved, GB/s. The last stdout line is
one JSON object.

    python3 benchmarks/weight_sync.py --full-size     # CUDA: 20 B Qwen-Image, random weights (random_weights.py)
    python3 benchmarks/weight_sync.py --full-size --modes full_nccl lora_nccl   # 2 GPUs: separate pools
    python3 benchmarks/weight_sync.py                 # CPU: the tiny model, host rows only
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

logger = logging.getLogger("weight_sync")
HERE = Path(__file__).resolve().parent
MODES = ("full_ipc", "full_host", "lora_ipc", "lora_host", "full_nccl", "lora_nccl")
# the engine's GPU in the *_nccl modes (this process sends from GPU 0)
NCCL_ROLLOUT_GPU = 1


def meta_transformer(model_dir: Path):
    from diffusers import QwenImageTransformer2DModel

    config = QwenImageTransformer2DModel.load_config(model_dir, subfolder="transformer")
    with torch.device("meta"):
        return QwenImageTransformer2DModel.from_config(config)


def recipe_lora(model_dir: Path, rank: int, alpha: int, device: torch.device) -> tuple[dict, dict]:
    """``(peft_config, tensors)`` in the rollout's names, as ``DiffusersFSDPEngine.get_per_tensor_param`` makes them."""
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    from verl_omni.pipelines.qwen_image.training_adapter import QwenImageTrainingAdapter

    model = meta_transformer(model_dir)
    model.add_adapter(
        LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(QwenImageTrainingAdapter.lora_target_modules))
    )
    shapes = {name: t.shape for name, t in get_peft_model_state_dict(model).items()}
    generator = torch.Generator(device).manual_seed(0)
    tensors = {name: 0.01 * torch.randn(shape, generator=generator, device=device) for name, shape in shapes.items()}
    return QwenImageTrainingAdapter.rollout_lora(tensors, model.peft_config["default"].to_dict())


def transformer_plan(model_dir: Path, bucket_bytes: int) -> tuple[list[list[str]], dict[str, torch.Size]]:
    from verl_omni.workers.rollout.weight_buckets import plan_buckets

    shapes = {name: t.shape for name, t in meta_transformer(model_dir).state_dict().items()}
    sizes = ((name, shape.numel() * 2) for name, shape in shapes.items())
    return plan_buckets(sizes, bucket_bytes), shapes


def random_bucket(names, shapes, device, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator(device).manual_seed(seed)
    return {n: torch.randn(shapes[n], generator=generator, device=device).to(torch.bfloat16) for n in names}


async def time_full_sync(engine, plan, shapes, device, version: int, mode: str, buckets: int, sender=None):
    """Seconds and bytes of a checked sync of the first ``buckets`` buckets (the whole plan by CUDA IPC or NCCL)."""
    from verl_omni.workers.rollout import device_share
    from verl_omni.workers.rollout.weight_buckets import WeightBucket

    await engine.begin_weight_sync(version, len(plan))
    seconds, nbytes, kept = 0.0, 0, []
    for index, names in enumerate(plan[:buckets]):
        tensors = random_bucket(names, shapes, device, seed=version * 1000 + index)
        nbytes += sum(t.numel() * t.element_size() for t in tensors.values())
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        if mode == "full_ipc":
            handle, buffer = device_share.share(tensors, device)
            kept = [*kept[-1:], buffer]
            bucket = WeightBucket.shared_build(version, index, len(plan), handle)
        elif mode == "full_nccl":
            bucket = WeightBucket.broadcast_build(version, index, len(plan), sender.stage(tensors))
        else:
            bucket = WeightBucket.build(version, index, len(plan), tensors)
        await _with_sender(engine.load_weight_bucket(bucket), sender if mode == "full_nccl" else None)
        seconds += time.perf_counter() - start
        del tensors
    if buckets == len(plan):
        await engine.finish_weight_sync(version)
    return seconds, nbytes


async def _with_sender(receiving, sender):
    """Await the engine's receiving call; with a ``sender``, its broadcast runs meanwhile (in a thread: it blocks
    until the engine's worker takes part, and the engine's call needs this loop)."""
    if sender is None:
        return await receiving
    result, _ = await asyncio.gather(receiving, asyncio.to_thread(sender.send))
    return result


def start_engine(args, model_path: Path, gpu: int | None):
    """The rollout engine; ``gpu``: the only GPU its processes see (this process keeps every GPU)."""
    from verl_omni.workers.rollout.vllm_omni.engine import OmniRolloutEngine

    extra = {}
    if args.full_size:
        from random_pipelines import LOG_PROB_PIPELINE

        extra = {"custom_pipeline": LOG_PROB_PIPELINE, "enforce_eager": True}
    engine = OmniRolloutEngine(str(model_path), dtype=args.dtype, max_batch_requests=1, **extra)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if gpu is not None:
        torch.cuda.init()
        gpus = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus[gpu]
    try:
        engine.start()
    finally:
        if visible is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = visible
    return engine


async def connect(engine, device: torch.device):
    """This process as the weight group's sender on ``device``, the engine's workers joined (NCCL)."""
    from verl_omni.workers.rollout.collective_share import CollectiveSender

    sender = CollectiveSender(1 + await engine.worker_count(), device, "127.0.0.1")
    await asyncio.gather(engine.join_weight_group(sender.group, 1), asyncio.to_thread(sender.connect))
    return sender


async def run(args, model_path: Path) -> list[dict]:
    from verl_omni.workers.rollout import device_share

    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    nccl = any(m.endswith("_nccl") for m in args.modes)
    engine = start_engine(args, model_path, NCCL_ROLLOUT_GPU if nccl else None)
    rows = []
    try:
        sender = await connect(engine, device) if nccl else None
        plan, shapes = transformer_plan(model_path, args.bucket_mb << 20)
        total = sum(shape.numel() * 2 for shape in shapes.values())
        logger.info("transformer: %.2f GB in %d buckets of <= %d MiB", total / 1e9, len(plan), args.bucket_mb)
        version = 0
        # the host rows time part of a sync and leave it open; the next sync's begin drops it
        for mode in [m for m in ("full_ipc", "full_nccl", "full_host") if m in args.modes]:
            count = min(args.host_buckets, len(plan)) if mode == "full_host" else len(plan)
            times = []
            for _ in range(args.repeats):
                version += 1
                seconds, nbytes = await time_full_sync(engine, plan, shapes, device, version, mode, count, sender)
                times.append(seconds)
                logger.info("%s: %d buckets, %.2f GB in %.2f s", mode, count, nbytes / 1e9, seconds)
            rows.append(_row(mode, times, nbytes))
        if not any(m.startswith("lora") for m in args.modes):
            return rows
        config, tensors = recipe_lora(model_path, args.lora_rank, args.lora_alpha, device)
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        logger.info("LoRA: %d tensors, %.2f GB (%s)", len(tensors), nbytes / 1e9, next(iter(tensors.values())).dtype)
        for mode in [m for m in ("lora_ipc", "lora_nccl", "lora_host") if m in args.modes]:
            times = []
            for _ in range(args.repeats):
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                start = time.perf_counter()
                if mode == "lora_ipc":
                    handle, buffer = device_share.share(tensors, device)
                    await engine.load_lora_tensors(config, shared=[handle])
                    del buffer
                elif mode == "lora_nccl":
                    sent = sender.stage(tensors)
                    await _with_sender(engine.load_lora_tensors(config, broadcast=sent), sender)
                else:
                    await engine.load_lora_tensors(config, {n: t.to("cpu") for n, t in tensors.items()})
                times.append(time.perf_counter() - start)
                logger.info("%s: %.2f s", mode, times[-1])
            rows.append(_row(mode, times, nbytes))
    finally:
        engine.shutdown()
    return rows


def _row(mode: str, times: list[float], nbytes: int) -> dict:
    seconds = statistics.median(times)
    return {
        "mode": mode,
        "seconds": round(seconds, 3),
        "gb": round(nbytes / 1e9, 3),
        "gb_s": round(nbytes / 1e9 / seconds, 2),
    }


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda with --full-size")
    parser.add_argument("--full-size", action="store_true", help="the 20 B Qwen-Image transformer, random bf16 (CUDA)")
    parser.add_argument(
        "--bucket-mb", type=int, default=2048, help="rollout.checkpoint_engine.update_weights_bucket_megabytes"
    )
    parser.add_argument("--host-buckets", type=int, default=2, help="buckets timed on the host path")
    parser.add_argument("--lora-rank", type=int, default=64)
    parser.add_argument("--lora-alpha", type=int, default=128)
    parser.add_argument("--modes", nargs="+", choices=MODES, help="default: all (CPU: the host ones)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", help="also write the JSON result here")
    args = parser.parse_args(argv)
    args.device = args.device or ("cuda" if args.full_size else "cpu")
    if args.full_size and args.device != "cuda":
        parser.error("--full-size needs --device cuda (the transformer alone is ~40 GB in bf16)")
    args.dtype = "float32" if args.device == "cpu" else "bfloat16"
    args.modes = args.modes or [
        m for m in MODES if (args.device == "cuda" and m.endswith("_ipc")) or m.endswith("_host")
    ]
    if args.device == "cpu" and any(m.endswith(("_ipc", "_nccl")) for m in args.modes):
        parser.error("the *_ipc and *_nccl modes need --device cuda (CUDA IPC, NCCL)")
    nccl = any(m.endswith("_nccl") for m in args.modes)
    if nccl and any(m.endswith("_ipc") for m in args.modes):
        parser.error("the *_nccl modes put the rollout on GPU 1 and the *_ipc modes need it on GPU 0: run them apart")
    if nccl and torch.cuda.device_count() < 2:
        parser.error(f"the *_nccl modes need 2 GPUs (sender on 0, rollout on 1); {torch.cuda.device_count()} visible")
    return args


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    # the engine imports the random-weight pipeline by name in its own process
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    sys.path.insert(0, str(HERE))
    with tempfile.TemporaryDirectory(prefix="weight_sync_") as tmp:
        if args.full_size:
            from random_weights import write_full_size_model_dir

            model_path = write_full_size_model_dir(Path(tmp) / "qwen_image_full")
        else:
            from verl_omni.utils.tiny_models import build_tiny_model

            model_path = Path(build_tiny_model("qwen_image", Path(tmp) / "tiny", seed=0))
        rows = asyncio.run(run(args, model_path))
    for row in rows:
        logger.info("%-10s %8.3f s  %7.3f GB  %7.2f GB/s", row["mode"], row["seconds"], row["gb"], row["gb_s"])
    result = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    return rows


if __name__ == "__main__":
    main()

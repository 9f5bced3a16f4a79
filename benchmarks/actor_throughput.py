"""Throughput of the actor's replay: forward + backward of one recorded step, samples/s per micro-batch size.

``python benchmarks/actor_throughput.py [--model-path DIR] [--full-size] [--micro-batches 1 2 4 8]``

Each sample is one replayed transition (``verl_omni.workers.utils.replay.replay_step``: velocity,
SDE step, log-prob) followed by the backward of its log-prob into a peft LoRA, the unit of work
of ``update_actor``. FLOPs are counted by ``torch.utils.flop_counter`` on one measured step
(matmuls and attention, forward and backward), so TFLOP/s needs no hand-written formula; the
ceiling is a measured square matmul in the compute dtype on the same device.

Default: the tiny random Qwen-Image (built into a temporary directory), fp32 on whatever device
is present. ``--full-size``: the real Qwen-Image transformer architecture with random bf16
weights on CUDA, LoRA r=64, 512x512 images.

``--variants`` runs ways of computing the same replay side by side on one model, in order: ``batched``
(true CFG's two passes as one transformer call, the adapter's default), ``sequential`` (the two passes one
after the other) and ``compiled`` (batched, each transformer block's forward compiled as the engine's
``model.compile_transformer_blocks`` does; last). ``--compile-dynamic true false`` measures the compiled
variant once per ``model.compile_dynamic`` setting, the blocks' eager forward restored and dynamo's caches
cleared in between. ``--fsdp`` runs the replay as the engine does: FSDP2's mixed precision casts the inputs,
no autocast.

``--checkpoint-fractions`` and ``--reshard-after-forward`` measure memory against recompute side by side at each
micro-batch, on the same model: the share of blocks recomputed in the backward
(``model.gradient_checkpointing_fraction``; each row's FLOPs are counted as that row runs, so a row that recomputes
less counts fewer), and whether FSDP2 gathers the parameters again for the backward
(``actor.engine.reshard_after_forward``; on one rank the gather is a copy of every parameter).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from verl_omni.pipelines.qwen_image.tiny_model import QWEN_IMAGE_SCHEDULER_CONFIG
from verl_omni.pipelines.qwen_image.training_adapter import QwenImageTrainingAdapter
from verl_omni.pipelines.sampling import SamplingSpec
from verl_omni.pipelines.schedulers import FlowMatchSDEDiscreteScheduler
from verl_omni.workers.utils.replay import prepare_scheduler, replay_step

logger = logging.getLogger(__name__)

ADAPTER = QwenImageTrainingAdapter


class SequentialCFGAdapter(QwenImageTrainingAdapter):
    """The adapter with true CFG's two passes one after the other (``batch_cfg=False``), to compare with."""

    @staticmethod
    def predict_velocity(*args, **kwargs):
        return QwenImageTrainingAdapter.predict_velocity(*args, **kwargs, batch_cfg=False)


# variant -> the adapter it replays with; "compiled" also compiles the blocks
VARIANTS = {"batched": ADAPTER, "sequential": SequentialCFGAdapter, "compiled": ADAPTER}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-path", default=None, help="diffusers Qwen-Image directory (default: the tiny one)")
    p.add_argument("--full-size", action="store_true", help="real architecture, random bf16 weights, CUDA")
    p.add_argument("--micro-batches", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--size", type=int, default=None, help="image side in pixels (default 512 full-size, 64 tiny)")
    p.add_argument("--text-len", type=int, default=128, help="prompt embedding length")
    p.add_argument("--lora-rank", type=int, default=None, help="default 64 full-size, 8 tiny")
    p.add_argument("--cfg", type=float, default=1.0, help="true CFG scale (> 1 doubles the transformer passes)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--no-gradient-checkpointing", action="store_true")
    p.add_argument(
        "--checkpoint-fractions",
        type=float,
        nargs="+",
        default=None,
        help="shares of the blocks recomputed in backward, one row each (default: all, or none with the flag above)",
    )
    p.add_argument(
        "--reshard-after-forward",
        choices=("true", "false"),
        nargs="+",
        default=["true"],
        help="with --fsdp: FSDP2's reshard_after_forward, one row each",
    )
    p.add_argument(
        "--variants",
        nargs="+",
        choices=VARIANTS,
        default=["batched"],
        help="replay variants measured side by side, in order ('compiled' last)",
    )
    p.add_argument(
        "--compile-dynamic",
        choices=("true", "false"),
        nargs="+",
        default=["false"],
        help="the compiled variant's model.compile_dynamic (default: the engine's, false), one set of rows each",
    )
    p.add_argument("--forward-only", action="store_true", help="no backward (the old_log_prob and ref phases)")
    p.add_argument(
        "--fsdp",
        action="store_true",
        help="wrap like DiffusersFSDPEngine (FSDP2 per block, bf16 compute params incl. LoRA) on one rank",
    )
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--profile", default=None, help="write a kernel-time breakdown of the largest micro-batch here")
    args = p.parse_args(argv)
    if args.reshard_after_forward != ["true"] and not args.fsdp:
        p.error("--reshard-after-forward needs --fsdp")
    if "compiled" in args.variants[:-1]:
        p.error("--variants: 'compiled' must come last (the rows after it would run the compiled blocks)")
    return args


def build_transformer(args, model_path, device: torch.device, dtype: torch.dtype):
    """The transformer with a LoRA; random full-size weights, or loaded from ``model_path``."""
    from diffusers import QwenImageTransformer2DModel
    from peft import LoraConfig

    if args.full_size:
        with torch.device(device):
            model = QwenImageTransformer2DModel().to(dtype)  # diffusers' defaults are the released architecture
        vae_scale_factor = 8
    else:
        model = ADAPTER.load_transformer(model_path, dtype=dtype).to(device)
        vae_scale_factor = ADAPTER.vae_scale_factor(model_path)
    if not args.no_gradient_checkpointing:
        model.enable_gradient_checkpointing()
    model.requires_grad_(False)
    rank = args.lora_rank or (64 if args.full_size else 8)
    model.add_adapter(LoraConfig(r=rank, lora_alpha=rank, target_modules=list(ADAPTER.lora_target_modules)))
    for p in model.parameters():
        if p.requires_grad:
            p.data = p.data.float()
    if args.fsdp:
        shard_like_engine(model, device, dtype)
    return model, vae_scale_factor


def shard_like_engine(model, device: torch.device, dtype: torch.dtype) -> None:
    """FSDP2 over one rank with the engine's mixed precision: every parameter (the fp32 LoRA too)
    reaches the kernels in ``dtype``, cast once per all-gather instead of per call under autocast."""
    import os

    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    for block in model.transformer_blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)


def set_checkpointing(model, fraction: float) -> None:
    """Recompute ``fraction`` of the blocks in the backward, as ``model.gradient_checkpointing_fraction`` does."""
    from verl_omni.workers.engine.fsdp.block_checkpointing import checkpoint_share_of_blocks

    if fraction > 0:
        checkpoint_share_of_blocks(model, ADAPTER.fsdp_wrap_blocks, fraction)
    else:
        model.disable_gradient_checkpointing()


def uncompile_blocks(model) -> None:
    """The blocks' own forward again, and dynamo's caches emptied: the next compile starts from nothing, as a new
    run would (``compile_blocks`` sets ``forward`` on each block instance)."""
    from verl_omni.workers.engine.fsdp.block_checkpointing import blocks_of_classes

    for block in blocks_of_classes(model, ADAPTER.fsdp_wrap_blocks, "--variants compiled"):
        block.__dict__.pop("forward", None)
    torch._dynamo.reset()


def make_batch(model, spec: SamplingSpec, batch: int, text_len: int, vae_scale_factor: int, device, scheduler) -> dict:
    """Random recorded transitions at the first scheduled step, shaped as the rollout records them."""
    cells = spec.height // (2 * vae_scale_factor) * (spec.width // (2 * vae_scale_factor))
    channels, text_dim = model.config.in_channels, model.config.joint_attention_dim
    prepare_scheduler(ADAPTER, scheduler, spec, cells)
    fields = {
        "all_latents": torch.randn(batch, 2, cells, channels, device=device),
        "all_timesteps": scheduler.timesteps[:1].expand(batch, 1).to(device),
        "prompt_embeds": torch.randn(batch, text_len, text_dim, device=device),
        "prompt_embeds_mask": torch.ones(batch, text_len, dtype=torch.long, device=device),
    }
    if spec.uses_cfg:
        fields["negative_prompt_embeds"] = torch.randn_like(fields["prompt_embeds"])
        fields["negative_prompt_embeds_mask"] = fields["prompt_embeds_mask"].clone()
    return fields


def fwd_bwd(
    model,
    scheduler,
    batch: dict,
    spec: SamplingSpec,
    vae_scale_factor: int,
    dtype: torch.dtype,
    adapter=ADAPTER,
    autocast: bool = True,
    forward_only: bool = False,
) -> None:
    """One replayed step and the backward of its log-prob (``forward_only``: under ``no_grad``, no backward).
    ``autocast=False``: the inputs reach the model as they are (``--fsdp``: FSDP2 casts them, as in the engine)."""
    enabled = autocast and dtype != torch.float32
    # no autocast context at all when off: the meta device (a FLOP count without memory) has none
    cast = torch.autocast(batch["all_latents"].device.type, dtype=dtype) if enabled else nullcontext()
    with cast:
        with torch.no_grad() if forward_only else nullcontext():
            out = replay_step(adapter, model, scheduler, batch, 0, spec, vae_scale_factor)
    if not forward_only:
        out.log_prob.mean().backward()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def matmul_ceiling_tflops(device: torch.device, dtype: torch.dtype, n: int) -> float:
    """TFLOP/s of a square n×n matmul in ``dtype`` on ``device``: the practical ceiling to compare against."""
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    _sync(device)
    reps = 20 if device.type == "cuda" else 3
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    _sync(device)
    return 2 * n**3 * reps / (time.perf_counter() - start) / 1e12


def measure(
    model,
    scheduler,
    spec,
    args,
    micro_batch: int,
    vae_scale_factor,
    device,
    dtype,
    adapter=ADAPTER,
    batch_fn=None,
    count: bool = True,
    autocast: bool = True,
    forward_only: bool = False,
) -> dict:
    """Samples/s and TFLOP/s of ``fwd_bwd`` at ``micro_batch``; ``batch_fn`` (``make_batch``'s signature) and
    ``adapter`` let another model's benchmark reuse the loop; ``count=False`` skips the FLOP count's extra step
    (no TFLOP/s)."""

    batch = (batch_fn or make_batch)(model, spec, micro_batch, args.text_len, vae_scale_factor, device, scheduler)
    step = (model, scheduler, batch, spec, vae_scale_factor, dtype, adapter, autocast, forward_only)
    for _ in range(args.warmup):
        fwd_bwd(*step)
    model.zero_grad(set_to_none=True)
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    for _ in range(args.iters):
        fwd_bwd(*step)
    _sync(device)
    seconds = (time.perf_counter() - start) / args.iters
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    model.zero_grad(set_to_none=True)
    flops = None
    if count:
        # FLOPs grow linearly with the samples (same shapes per sample): counted on one, where the counter's
        # attention path (below) fits in memory at any micro-batch
        one = (batch_fn or make_batch)(model, spec, 1, args.text_len, vae_scale_factor, device, scheduler)
        per_sample = count_flops(model, scheduler, one, *step[3:])
        flops = None if per_sample is None else per_sample * micro_batch
    return {
        "micro_batch": micro_batch,
        "samples_per_s": micro_batch / seconds,
        "step_s": seconds,
        "flops": flops,
        "tflops": None if flops is None else flops / seconds / 1e12,
        "peak_memory_gb": peak,
    }


def count_flops(model, scheduler, batch, *step) -> int | None:
    """FLOPs of one ``fwd_bwd``, counted after the timed steps: under ``FlopCounterMode`` (a dispatch mode) SDPA may
    take its math path, which holds the L × L attention matrix, so the count can run out of memory where the step
    does not (a long video); then ``None``."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    try:
        with counter:
            fwd_bwd(model, scheduler, batch, *step)
    except torch.OutOfMemoryError:
        logger.warning("FLOP count of one sample ran out of memory: no TFLOP/s")
        return None
    finally:
        model.zero_grad(set_to_none=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return counter.get_total_flops()


# kernel-name substrings -> category, first match wins (CUDA kernel names of cuBLAS/cuDNN/flash/Triton)
KERNEL_CATEGORIES = (
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    ("matmul", ("gemm", "cutlass", "sm90", "sm100", "nvjet", "matmul")),
    ("norm", ("norm",)),
    ("elementwise", ("elementwise", "vectorized", "unrolled", "reduce", "copy", "cat", "fill")),
)


def kernel_category(name: str) -> str:
    lowered = name.lower()
    for category, keys in KERNEL_CATEGORIES:
        if any(k in lowered for k in keys):
            return category
    return "other"


def profile_step(
    model, scheduler, spec, args, micro_batch: int, vae_scale_factor, device, dtype, out: Path, adapter=ADAPTER
) -> dict:
    """Device time per kernel category of one fwd+bwd (of the last variant), and the 25 longest kernels, written
    to ``out``."""
    from torch.profiler import ProfilerActivity, profile

    batch = make_batch(model, spec, micro_batch, args.text_len, vae_scale_factor, device, scheduler)
    step = (model, scheduler, batch, spec, vae_scale_factor, dtype, adapter, not args.fsdp, args.forward_only)
    fwd_bwd(*step)
    _sync(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        fwd_bwd(*step)
        _sync(device)
    model.zero_grad(set_to_none=True)
    events = [e for e in prof.key_averages() if e.device_type.name == ("CUDA" if device.type == "cuda" else "CPU")]
    attr = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    by_category: dict[str, float] = {}
    for event in events:
        category = kernel_category(event.key)
        by_category[category] = by_category.get(category, 0.0) + getattr(event, attr) / 1e3
    total = sum(by_category.values())
    top = sorted(events, key=lambda e: getattr(e, attr), reverse=True)[:25]
    lines = [f"micro-batch {micro_batch}: {total:.1f} ms of device time in kernels"]
    lines += [
        f"  {k:<12} {v:9.1f} ms {100 * v / total:5.1f} %" for k, v in sorted(by_category.items(), key=lambda kv: -kv[1])
    ]
    lines += ["", "longest kernels (ms, calls, name):"]
    lines += [f"  {getattr(e, attr) / 1e3:9.2f} {e.count:6d}  {e.key[:140]}" for e in top]
    out.write_text("\n".join(lines) + "\n")
    logger.info("\n".join(lines[: 2 + len(by_category)]))
    return {"micro_batch": micro_batch, "kernel_ms": total, "by_category_ms": by_category}


def main(argv=None) -> list[dict]:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.full_size and device.type != "cuda":
        raise SystemExit("--full-size needs a CUDA device (the transformer alone is ~40 GB in bf16)")
    dtype = torch.bfloat16 if args.full_size else torch.float32
    size = args.size or (512 if args.full_size else 64)
    spec = SamplingSpec(num_inference_steps=10, height=size, width=size, noise_level=0.7, true_cfg_scale=args.cfg)
    scheduler = FlowMatchSDEDiscreteScheduler(**QWEN_IMAGE_SCHEDULER_CONFIG)
    with tempfile.TemporaryDirectory(prefix="tiny_qwen_image_") as tmp:
        model_path = args.model_path
        if model_path is None and not args.full_size:
            from verl_omni.utils.tiny_models import build_tiny_model

            model_path = build_tiny_model("qwen_image", Path(tmp), seed=0)
        model, vae_scale_factor = build_transformer(args, model_path, device, dtype)
    ceiling = matmul_ceiling_tflops(device, dtype, 8192 if device.type == "cuda" else 1024)
    logger.info("device %s, %s, matmul ceiling %.4g TFLOP/s", device, dtype, ceiling)
    meta = {
        "device": str(device),
        "dtype": str(dtype),
        "size": size,
        "matmul_ceiling_tflops": ceiling,
        "fsdp": args.fsdp,
        "forward_only": args.forward_only,
        "cfg": args.cfg,
    }
    results, flops = [], {}
    default_fraction = 0.0 if args.no_gradient_checkpointing else 1.0
    settings = [
        (fraction, reshard == "true")
        for fraction in args.checkpoint_fractions or [default_fraction]
        for reshard in args.reshard_after_forward
    ]
    runs = [(variant, None) for variant in args.variants if variant != "compiled"]
    if "compiled" in args.variants:
        runs += [("compiled", dynamic == "true") for dynamic in args.compile_dynamic]
    for variant, dynamic in runs:
        if variant == "compiled":
            from verl_omni.workers.engine.fsdp.diffusers_impl import compile_blocks

            uncompile_blocks(model)
            count = compile_blocks(model, ADAPTER.fsdp_wrap_blocks, dynamic=dynamic)
            logger.info("compiled the forward of %d blocks, every size symbolic: %s", count, dynamic)
        for micro_batch, (fraction, reshard) in itertools.product(args.micro_batches, settings):
            set_checkpointing(model, fraction)
            if args.fsdp:
                model.set_reshard_after_forward(reshard)
            # the variants compute the same replay: its FLOPs are counted once per micro-batch and share of blocks
            # recomputed, eagerly
            key = (micro_batch, fraction)
            count = key not in flops and variant != "compiled"
            row = measure(
                model,
                scheduler,
                spec,
                args,
                micro_batch,
                vae_scale_factor,
                device,
                dtype,
                adapter=VARIANTS[variant],
                count=count,
                autocast=not args.fsdp,
                forward_only=args.forward_only,
            )
            if count:
                flops[key] = row["flops"]
            counted = flops.get(key)
            row.update(
                variant=variant, compile_dynamic=dynamic, checkpoint_fraction=fraction, reshard_after_forward=reshard
            )
            row["tflops"] = None if counted is None else counted / row["step_s"] / 1e12
            # no TFLOP/s when the FLOP count ran out of memory (count_flops)
            row["fraction_of_matmul_ceiling"] = None if row["tflops"] is None else row["tflops"] / ceiling
            results.append(row)
            if args.out:  # after each row: a later setting that runs out of memory keeps the ones before
                Path(args.out).write_text(json.dumps({"meta": meta, "results": results}, indent=2))
            logger.info(
                "%s (dynamic %s), micro-batch %d, %.2f of the blocks recomputed, reshard after forward %s: "
                "%.4g samples/s, %.4g s/step, %s TFLOP/s, fraction of matmul ceiling %s, peak %s GiB",
                variant,
                dynamic,
                micro_batch,
                fraction,
                reshard,
                row["samples_per_s"],
                row["step_s"],
                row["tflops"],
                row["fraction_of_matmul_ceiling"],
                row["peak_memory_gb"],
            )
    if args.profile:
        largest = max(args.micro_batches)
        meta["profile"] = profile_step(
            model,
            scheduler,
            spec,
            args,
            largest,
            vae_scale_factor,
            device,
            dtype,
            Path(args.profile),
            VARIANTS[variant],
        )
    if args.out:
        Path(args.out).write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    return results


if __name__ == "__main__":
    main()

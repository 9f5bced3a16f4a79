"""Rollout throughput on one replica: N concurrent ``generate`` vs one ``generate_batched(N)`` vs diffusers.

Same prompt, negative prompt (true CFG), steps and size for all three; each mode is warmed up once
and then timed over ``--repeats`` rounds (the two engine modes alternate round by round). The last stdout line is one JSON object with
``concurrent_img_s``, ``batched_img_s``, ``diffusers_img_s``, ``n``, ``steps``, ``size``, ``device``.

    python benchmarks/rollout_throughput.py --device cpu            # tiny random model, fp32
    python benchmarks/rollout_throughput.py --device cuda --full-size  # real architecture, random bf16, 512², 50 steps

On CPU the vLLM-Omni engine runs through verl_omni's CPU platform plugins (installed entry points).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import tempfile
import time
from pathlib import Path

import torch

logger = logging.getLogger("rollout_throughput")

PROMPT = "a red cat on a chair near a window"
NEGATIVE = " "


def build_model(args, workdir: Path) -> Path:
    if args.model_path:
        return Path(args.model_path)
    if args.full_size:
        from verl_omni.utils.tiny_models import build_tiny_model

        # the real Qwen-Image architecture with random weights: see _full_size_model
        return _full_size_model(workdir / "qwen_image_full", build_tiny_model)
    from verl_omni.utils.tiny_models import build_tiny_model

    return Path(build_tiny_model("qwen_image", workdir / "tiny_qwen_image", seed=0))


def _full_size_model(out: Path, build_tiny_model) -> Path:
    """Real-size Qwen-Image (transformer and VAE at their default configs, 20B/0.1B) with random bf16
    weights, reusing the tiny model's text encoder and tokenizer (the text side is not what is timed)."""
    from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel

    build_tiny_model("qwen_image", out, seed=0)
    with torch.device("cuda"):
        transformer = QwenImageTransformer2DModel(joint_attention_dim=_text_hidden_size(out)).to(torch.bfloat16)
        vae = AutoencoderKLQwenImage().to(torch.bfloat16)
    transformer.save_pretrained(out / "transformer")
    vae.save_pretrained(out / "vae")
    return out


def _text_hidden_size(model_dir: Path) -> int:
    config = json.loads((model_dir / "text_encoder" / "config.json").read_text())
    return int(config.get("text_config", config).get("hidden_size", config.get("hidden_size")))


def sampling(args, seed: int) -> dict:
    return {
        "height": args.size,
        "width": args.size,
        "num_inference_steps": args.steps,
        "true_cfg_scale": 4.0,
        "noise_level": 0.7,
        "sde_window_size": 2,
        "seed": seed,
    }


async def time_engine(args, model_path: Path) -> tuple[float, float]:
    from transformers import Qwen2Tokenizer

    from verl_omni.pipelines.qwen_image.rollout_request import prompt_token_ids
    from verl_omni.workers.rollout.vllm_omni.engine import OmniRolloutEngine

    tokenizer = Qwen2Tokenizer.from_pretrained(model_path, subfolder="tokenizer")
    ids, neg = prompt_token_ids(tokenizer, PROMPT), prompt_token_ids(tokenizer, NEGATIVE)
    engine = OmniRolloutEngine(str(model_path), dtype=args.dtype, max_batch_requests=args.n)
    start = time.perf_counter()
    engine.start()
    logger.info("engine started in %.1f s", time.perf_counter() - start)
    try:

        async def concurrent(round_id: int):
            calls = [
                engine.engine_call(ids, sampling(args, 1000 * round_id + i), f"c{round_id}-{i}", 1, neg)
                for i in range(args.n)
            ]
            await asyncio.gather(*calls)

        async def batched(round_id: int):
            await engine.engine_call(ids, sampling(args, 1000 * round_id), f"b{round_id}", args.n, neg)

        # warm up both, then alternate rounds so that load from other processes hits both modes alike
        await concurrent(0)
        await batched(0)
        elapsed = {concurrent: 0.0, batched: 0.0}
        for r in range(1, args.repeats + 1):
            for mode in (concurrent, batched):
                start = time.perf_counter()
                await mode(r)
                seconds = time.perf_counter() - start
                elapsed[mode] += seconds
                logger.info("%s round %d: %.3f s", mode.__name__, r, seconds)
        logger.info("requests per transformer batch (engine side): %s", await engine.request_batch_sizes())
        images = args.n * args.repeats
        return images / elapsed[concurrent], images / elapsed[batched]
    finally:
        engine.shutdown()


def time_diffusers(args, model_path: Path) -> float:
    from diffusers import QwenImagePipeline

    dtype = torch.float32 if args.dtype == "float32" else torch.bfloat16
    pipe = QwenImagePipeline.from_pretrained(model_path, torch_dtype=dtype).to(args.device)
    pipe.set_progress_bar_config(disable=True)

    def run(seed: int):
        pipe(
            prompt=PROMPT,
            negative_prompt=NEGATIVE,
            true_cfg_scale=4.0,
            height=args.size,
            width=args.size,
            num_inference_steps=args.steps,
            num_images_per_prompt=args.n,
            generator=torch.Generator(args.device).manual_seed(seed),
        )

    run(0)
    start = time.perf_counter()
    for r in range(1, args.repeats + 1):
        run(r)
    return args.n * args.repeats / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--full-size", action="store_true", help="real architecture, random bf16 weights (CUDA)")
    parser.add_argument("--model-path", help="an existing diffusers Qwen-Image directory")
    parser.add_argument("--n", type=int, default=4, help="images per prompt")
    parser.add_argument("--steps", type=int, help="denoising steps (default 8 on CPU, 50 full size)")
    parser.add_argument("--size", type=int, help="image side (default 64 on CPU, 512 full size)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.full_size and args.device != "cuda":
        parser.error("--full-size needs --device cuda")
    args.steps = args.steps or (50 if args.full_size else 8)
    args.size = args.size or (512 if args.full_size else 64)
    args.dtype = "float32" if args.device == "cpu" else "bfloat16"
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")

    with tempfile.TemporaryDirectory(prefix="rollout_bench_") as tmp:
        model_path = build_model(args, Path(tmp))
        concurrent_img_s, batched_img_s = asyncio.run(time_engine(args, model_path))
        diffusers_img_s = time_diffusers(args, model_path)
    print(
        json.dumps(
            {
                "concurrent_img_s": round(concurrent_img_s, 4),
                "batched_img_s": round(batched_img_s, 4),
                "diffusers_img_s": round(diffusers_img_s, 4),
                "n": args.n,
                "steps": args.steps,
                "size": args.size,
                "device": args.device,
            }
        )
    )


if __name__ == "__main__":
    main()

"""Mean brightness of a Qwen-Image checkpoint's ODE samples with the LoRA of each given step of a run.

An offline Diffusion-DPO run (``data.preference_files``) starts no rollout engine and so runs no validation; this
measures what validation would, in one process with diffusers: the prompts of a parquet, fixed seeds, CFG-free ODE
sampling at the run's size and steps, the base model (step 0) then each step's LoRA checkpoint:

    python benchmarks/offline_dpo_brightness.py --model DIR --run RUN_DIR --prompts val.parquet --steps 10 20 30
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
import torch


def mean_brightness(pipe, prompts: list[str], seeds: list[int], size: int, steps: int) -> float:
    """Mean pixel value in [0, 1] over every (prompt, seed) sample."""
    values = []
    for prompt in prompts:
        for seed in seeds:
            image = pipe(
                prompt=prompt,
                height=size,
                width=size,
                num_inference_steps=steps,
                true_cfg_scale=1.0,
                generator=torch.Generator().manual_seed(seed),
                output_type="np",
            ).images[0]
            values.append(float(np.asarray(image).mean()))
    return float(np.mean(values))


def main() -> None:
    from diffusers import QwenImagePipeline

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the diffusers checkpoint the run trained")
    parser.add_argument("--run", required=True, help="the run directory (global_step_<N>/actor/lora)")
    parser.add_argument("--prompts", required=True, help="a prompt parquet (its prompt column)")
    parser.add_argument("--steps", type=int, nargs="+", required=True, help="checkpointed steps to measure")
    parser.add_argument("--seeds", type=int, default=4, help="samples per prompt")
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--inference-steps", type=int, default=6)
    args = parser.parse_args()
    prompts = [p[-1]["content"] if not isinstance(p, str) else p for p in pd.read_parquet(args.prompts)["prompt"]]
    seeds = list(range(args.seeds))
    pipe = QwenImagePipeline.from_pretrained(args.model)
    print(f"step 0: {mean_brightness(pipe, prompts, seeds, args.size, args.inference_steps):.5f}")
    for step in args.steps:
        pipe.unload_lora_weights()
        pipe.load_lora_weights(str(Path(args.run) / f"global_step_{step}" / "actor" / "lora"))
        print(f"step {step}: {mean_brightness(pipe, prompts, seeds, args.size, args.inference_steps):.5f}")


if __name__ == "__main__":
    main()

"""Full Flow-GRPO steps of the Qwen-Image OCR LoRA recipe on one or more GPUs, timed per phase.

Runs ``examples/flowgrpo_trainer/run_qwen_image_ocr_lora.sh`` (512², 10 steps, true CFG 4, window
2 in [0, 5], noise 1.2, LoRA r64, n=16, actor and rollout colocated on the GPU) for a few steps
on a full-size Qwen-Image checkpoint with random weights, with a cheap reward in place of the
OCR server (``jpeg_compressibility``: the timing of generation and training does not depend on
what scores the images). Prints, per step and phase, seconds and images per GPU-second, and the steady state:
the median step after the first ``--warmup-steps`` (the compile steps), leaving out any later step in which the
actor compiled again (``perf/actor_compiled_graphs`` grew: the first step whose prompts have a new text length).
With π_old from the rollout checked every K steps (an ``actor.rollout_log_prob_check_freq=K`` override), the check
steps are summarised apart and ``img_per_gpu_s_with_checks`` is the rate over K steps of which one checks.

``--gpus N`` runs the launcher with ``NGPUS=N`` (N actor ranks and N colocated rollout replicas on one host);
keep the per-GPU load with ``--prompts`` = 8 x N (8 prompts x 16 images = 128 images per GPU).

The checkpoint is a real directory that ``model.path`` points at, written once by
``--write-model``: the released transformer architecture (20.4 B) with random bf16 weights, the
full-size VAE, and the tiny text side of ``benchmarks/random_weights.py`` (prompt encoding is
not what is timed). FLOPs do not depend on the weights.

    python3 benchmarks/flowgrpo_recipe_step.py --model /tmp/qwen_image_random --write-model \
        --prompts 8 --steps 2 --out /tmp/recipe

``--recipe sd3`` runs ``run_sd3_ocr_lora.sh`` instead (the Flow-GRPO paper's SD3.5 recipe) on SD3.5 Medium's
full-size transformer (2.5 B, random weights) with the authors' one-GPU batch (8 images per prompt, mini-batch
32, micro-batch 8); add ``actor_rollout_ref.model.lora.rank=0 actor_rollout_ref.model.lora.merge=false`` for its full
fine-tuning step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
PHASES = ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "sync", "step")


@dataclass(frozen=True)
class Recipe:
    """A launcher and what its one-GPU step needs: samples per prompt, the overrides that make it fit one GPU."""

    launcher: str
    samples_per_prompt: int
    one_gpu_overrides: tuple[str, ...] = ()


RECIPES = {
    "qwen_image": Recipe("examples/flowgrpo_trainer/run_qwen_image_ocr_lora.sh", 16),
    # the authors' one-GPU variant the preset's comment names (8 prompts x 8 images, mini-batch 4 prompts = 32 images)
    "sd3": Recipe(
        "examples/flowgrpo_trainer/run_sd3_ocr_lora.sh",
        8,
        (
            "actor_rollout_ref.rollout.n=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            # the launcher's micro-batch of 9 does not divide 32
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        ),
    ),
}


def write_random_checkpoint(out: Path, recipe: str) -> None:
    """The full-size transformer with random bf16 weights saved as safetensors, beside the rest."""
    from diffusers import QwenImageTransformer2DModel, SD3Transformer2DModel
    from random_weights import fill_random_, write_full_size_model_dir, write_full_size_sd3_dir

    start = time.perf_counter()
    if recipe == "sd3":
        write_full_size_sd3_dir(out)
        model_class = SD3Transformer2DModel
    else:
        write_full_size_model_dir(out)
        model_class = QwenImageTransformer2DModel
    config = model_class.load_config(out / "transformer")
    with torch.device("meta"):
        transformer = model_class.from_config(config).to(torch.bfloat16)
    transformer = transformer.to_empty(device="cuda")
    fill_random_(transformer)
    transformer.to("cpu").save_pretrained(out / "transformer", max_shard_size="10GB")
    # the trainer's processes share this GPU: give back this process's cached 40 GB
    del transformer
    torch.cuda.empty_cache()
    size = sum(f.stat().st_size for f in (out / "transformer").glob("*.safetensors")) / 1e9
    print(f"[recipe] wrote {size:.1f} GB of random transformer weights to {out} in {time.perf_counter() - start:.0f} s")


def run_steps(
    recipe: Recipe, model: Path, data: Path, out: Path, prompts: int, steps: int, gpus: int, extra: list[str]
) -> None:
    """The launcher with the recipe unchanged except batch size, step count, GPUs, reward and logging."""
    overrides = [
        *recipe.one_gpu_overrides,
        f"data.train_batch_size={prompts}",
        f"trainer.total_training_steps={steps}",
        "'reward.diffusion.scorers=[{type: jpeg_compressibility}]'",
        "reward.diffusion.num_workers=4",
        "trainer.val_before_train=false",
        "trainer.test_freq=0",
        "trainer.save_freq=0",
        "trainer.logger=[console,file]",
        *extra,
    ]
    env = {**os.environ, "MODEL_PATH": str(model), "DATA_DIR": str(data), "OUT": str(out), "NGPUS": str(gpus)}
    command = f"bash {REPO / recipe.launcher} " + " ".join(overrides)
    print(f"[recipe] {command}", flush=True)
    start = time.perf_counter()
    subprocess.run(command, shell=True, check=True, env=env, cwd=REPO)
    print(f"[recipe] trainer process: {time.perf_counter() - start:.0f} s")


def report(out: Path, images_per_step: int, gpus: int) -> list[dict]:
    """Per step: seconds and images per GPU-second of each phase (every GPU holds every phase, colocated)."""
    rows = []
    for line in (out / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        data = record["data"]
        row = {"step": record["step"], "images": images_per_step, "gpus": gpus}
        for phase in PHASES:
            seconds = data.get(f"timing_s/{phase}")
            if seconds is not None:
                row[f"{phase}_s"] = round(seconds, 2)
                row[f"{phase}_img_per_gpu_s"] = round(images_per_step / gpus / seconds, 3)
        for key in (
            "old_log_prob/rollout_diff_max",
            "actor/logprob_diff_max",
            "actor/is_truncated_frac",
            "actor/grad_norm",
            "critic/score/mean",
            "rollout/engine_batches",
            "rollout/requests_per_engine_batch",
            "perf/actor_max_memory_allocated_gb",
            "perf/actor_max_memory_reserved_gb",
            "sync/full_weight_megabytes",
            "sync/full_weight_seconds",
            "sync/wake_seconds",
            "sync/actor_cache_released_gib",
            "perf/actor_compiled_graphs",
        ):
            if key in data:
                row[key] = data[key]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


# the actor's count of compiled graphs after each update (DiffusionActorWorker.update_actor)
GRAPHS = "perf/actor_compiled_graphs"


def steady_state(rows: list[dict], warmup_steps: int, check_freq: int = 0) -> dict:
    """The median step after the compile steps, with each phase's median, as one summary row. The compile steps
    are the first ``warmup_steps`` (the actor's and the rollout's first compiles) and any later step in which the
    actor compiled another graph; they are listed as ``recompiled_steps``.

    With π_old taken from the rollout (``actor.use_rollout_log_probs``) and its check every K steps
    (``actor.rollout_log_prob_check_freq``), the steps that ran the check carry an ``old_log_prob`` phase the others
    skip: the median is over the others (the rate between checks), and the check steps are listed with their median
    apart. Given K (``check_freq``), the rate over K steps of which one checks is ``img_per_gpu_s_with_checks``.
    """
    # a step whose actor compiled more graphs than the step before (a new text length, with model.compile_dynamic
    # false) is a compile step too, wherever it falls
    recompiled = [
        row["step"]
        for before, row in zip(rows, rows[1:], strict=False)
        if row["step"] > warmup_steps and GRAPHS in before and GRAPHS in row and row[GRAPHS] > before[GRAPHS]
    ]
    after = [row for row in rows if row["step"] > warmup_steps and "step_s" in row and row["step"] not in recompiled]
    checked = [row for row in after if "old_log_prob_s" in row]
    # every step has the phase when the actor recomputes π_old each step: nothing to set apart then
    checks_apart = 0 < len(checked) < len(after)
    steady = [row for row in after if "old_log_prob_s" not in row] if checks_apart else after
    if not steady:
        return {"steady_steps": 0}
    summary = {"steady_steps": len(steady), "first_steady_step": steady[0]["step"]}
    if recompiled:
        summary["recompiled_steps"] = recompiled
    for phase in PHASES:
        values = [row[f"{phase}_s"] for row in steady if f"{phase}_s" in row]
        if values:
            summary[f"{phase}_s"] = round(statistics.median(values), 2)
    summary["img_per_gpu_s"] = round(rows[0]["images"] / rows[0]["gpus"] / summary["step_s"], 3)
    if checks_apart:
        summary["check_steps"] = [row["step"] for row in checked]
        summary["check_step_s"] = round(statistics.median(row["step_s"] for row in checked), 2)
        if check_freq > 0:
            period_s = (check_freq - 1) * summary["step_s"] + summary["check_step_s"]
            summary["img_per_gpu_s_with_checks"] = round(rows[0]["images"] / rows[0]["gpus"] * check_freq / period_s, 3)
    print("[recipe] steady state " + json.dumps(summary), flush=True)
    return summary


def check_freq(overrides: list[str]) -> int:
    """The run's ``actor.rollout_log_prob_check_freq`` from its overrides (0: not given, the launcher's 0)."""
    given = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0].endswith(".rollout_log_prob_check_freq")]
    return int(given[-1]) if given else 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, required=True, help="checkpoint directory (written by --write-model)")
    p.add_argument("--write-model", action="store_true", help="write the random full-size checkpoint first")
    p.add_argument("--recipe", choices=sorted(RECIPES), default="qwen_image", help="which launcher and model")
    p.add_argument("--prompts", type=int, default=8, help="prompts per step (x the recipe's samples each)")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--gpus", type=int, default=1, help="actor ranks = colocated rollout replicas (NGPUS)")
    p.add_argument("--warmup-steps", type=int, default=2, help="compile steps left out of the steady state")
    p.add_argument("--out", type=Path, default=Path("/tmp/flowgrpo_recipe"))
    p.add_argument("--json", type=Path, default=None, help="write the per-step rows here")
    p.add_argument("overrides", nargs="*", help="further Hydra overrides for the launcher")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("the recipe step needs a CUDA GPU")
    sys.path.insert(0, str(Path(__file__).parent))
    recipe = RECIPES[args.recipe]
    if args.write_model:
        write_random_checkpoint(args.model, args.recipe)
    from verl_omni.utils.dataset.t2i_prompts import ocr_rows, write_parquet

    data = args.out / "data"
    write_parquet(ocr_rows(max(args.prompts * args.steps, 16), "train", 0, 2), data / "train.parquet")
    write_parquet(ocr_rows(16, "val", 0, 2), data / "val.parquet")
    run_steps(recipe, args.model, data, args.out / "run", args.prompts, args.steps, args.gpus, args.overrides)
    rows = report(args.out / "run", args.prompts * recipe.samples_per_prompt, args.gpus)
    summary = steady_state(rows, args.warmup_steps, check_freq(args.overrides))
    if args.json:
        args.json.write_text(json.dumps({"steps": rows, "steady_state": summary}, indent=1))


if __name__ == "__main__":
    main()

"""Builders shared by the trainer tests: prompt files and a run of the real entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROMPTS = (
    "a red cat",
    "a photo of a small blue boat near a river under the moon at night",
    "a green tree",
    "a large white castle behind a garden with a yellow flower",
)


def write_prompt_files(root: Path) -> tuple[Path, Path]:
    """Train and val parquet files whose prompts alternate short and long."""
    from verl_omni.utils.dataset.t2i_prompts import prompt_row, write_parquet

    train = write_parquet(
        [prompt_row(p, None, i, "train", "e2e") for i, p in enumerate(PROMPTS * 2)], root / "t.parquet"
    )
    val = write_parquet([prompt_row(p, None, i, "val", "e2e") for i, p in enumerate(PROMPTS[:2])], root / "v.parquet")
    return train, val


def write_edit_prompt_files(root: Path) -> tuple[Path, Path]:
    """:func:`write_prompt_files`' prompts as editing instructions, each with its own source image (PNG bytes,
    sides unlike the output's so the image tokens have another grid)."""
    import io

    from PIL import Image

    from verl_omni.utils.dataset.edit_prompts import edit_row
    from verl_omni.utils.dataset.t2i_prompts import write_parquet

    def rows(prompts, split: str) -> list[dict]:
        out = []
        for i, prompt in enumerate(prompts):
            buffer = io.BytesIO()
            Image.new("RGB", (40, 24), (40 * i, 200 - 20 * i, 90)).save(buffer, format="PNG")
            out.append(edit_row(prompt, [{"bytes": buffer.getvalue()}], i, split, "e2e_edit"))
        return out

    return write_parquet(rows(PROMPTS * 2, "train"), root / "t.parquet"), write_parquet(
        rows(PROMPTS[:2], "val"), root / "v.parquet"
    )


def run_trainer(out: Path, model: Path, prompts, cluster, *overrides: str) -> tuple[list[dict], float]:
    """Run the entry point (tiny sizes, then ``overrides``) on the session's Ray ``cluster`` (``ray_cluster``
    in ``tests/conftest.py``); return the metrics file's records and the wall time."""
    address, env, _ = cluster
    start = time.perf_counter()
    proc = run_entry_point(out, model, prompts, f"ray_kwargs.ray_init.address={address}", *overrides, env=env)
    wall = time.perf_counter() - start
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return read_metrics(out), wall


def run_entry_point(out: Path, model: Path, prompts, *overrides: str, env: dict | None = None):
    """``python -m verl_omni.trainer.main_flowgrpo`` with the tiny sizes and ``overrides``; the finished process."""
    return subprocess.run(
        entry_point_command(out, model, prompts, *overrides),
        cwd=out.parent,
        env=env or entry_point_env(),
        capture_output=True,
        text=True,
        timeout=1500,
    )


def entry_point_command(out: Path, model: Path, prompts, *overrides: str) -> list[str]:
    """The command line of :func:`run_entry_point`: the entry point with the tiny sizes and ``overrides``.

    The tiny sizes are model-neutral (no guidance key): every model's defaults must work with them. An override
    of a key the tiny sizes set replaces it (Hydra refuses a key given twice)."""
    train, val = prompts
    tiny = [
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.lora.rank=4",
        "actor_rollout_ref.model.lora.alpha=8",
        "actor_rollout_ref.rollout.height=32",
        "actor_rollout_ref.rollout.width=32",
        "actor_rollout_ref.rollout.num_inference_steps=4",
        "actor_rollout_ref.rollout.sde_window_size=2",
        "actor_rollout_ref.rollout.n=2",
        # one agent-loop worker takes a tiny step's prompt groups as well as two, and every Ray process of a run
        # costs the suite its imports (tests/agent_loop covers the split over several)
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=1e-2",
        f"data.train_files={train}",
        f"data.val_files={val}",
        "data.train_batch_size=2",
        "data.shuffle=false",
        "trainer.logger=[console,file]",
        f"trainer.default_local_dir={out}",
        "trainer.val_before_train=true",
    ]
    overridden = {o.split("=", 1)[0].lstrip("+") for o in overrides}
    args = [a for a in tiny if a.split("=", 1)[0] not in overridden] + list(overrides)
    return [sys.executable, "-m", "verl_omni.trainer.main_flowgrpo", *args]


def entry_point_env() -> dict:
    """This environment with this checkout first on ``PYTHONPATH`` (the run's Ray workers inherit it)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}


def read_metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def by_step(records: list[dict]) -> dict[int, dict]:
    return {r["step"]: r["data"] for r in records}


# fp32 CPU bound of docs/guide/training.md: the rollout's and the actor's transformers differ in op order only
LOGPROB_BOUND = 1e-5
STEP_KEYS = (
    "timing_s/gen",
    "timing_s/reward",
    "timing_s/update_actor",
    "timing_s/sync",
    "timing_s/step",
    "perf/images_per_s",
    "critic/score/mean",
    "critic/score/max",
    "critic/score/min",
    "critic/score/zero_std_group_frac",
    "actor/logprob_diff_max",
    "actor/pg_loss",
    "actor/grad_norm",
)


def lora_of(run: Path, step: int) -> dict:
    """The LoRA tensors of step ``step``'s checkpoint, as diffusers reads the file."""
    from safetensors.torch import load_file

    return load_file(run / f"global_step_{step}" / "actor" / "lora" / "pytorch_lora_weights.safetensors")


def lora_b_norm(run: Path, step: int) -> float:
    return sum(float(t.norm()) for name, t in lora_of(run, step).items() if "lora_B" in name)


def image_of(path: Path):
    import numpy as np
    from PIL import Image

    return np.asarray(Image.open(path))


def check_run(
    run: Path, records: list[dict], steps: int, extra_keys: tuple[str, ...], merged_lora: bool = False
) -> None:
    """Every step logged with the required keys, log-probs consistent, LoRA trained and synced: as an adapter the
    rollout binds, or (``merged_lora``, ``model.lora.merge``) merged into the weights, in buckets that wrote it."""
    metrics = by_step(records)
    assert sorted(metrics) == list(range(steps + 1)), "one record per step, step 0 = validation before training"
    synced = "sync/merged_lora_params_written_min" if merged_lora else "sync/lora_modules_bound_min"
    for step in range(1, steps + 1):
        missing = [k for k in (*STEP_KEYS, *extra_keys, synced) if k not in metrics[step]]
        assert not missing, f"step {step} lacks {missing}"
        assert metrics[step]["actor/logprob_diff_max"] <= LOGPROB_BOUND
        assert metrics[step][synced] > 0
        assert metrics[step]["perf/images_per_s"] > 0
    # LoRA B starts at zero: a non-zero B is a trained LoRA
    assert lora_b_norm(run, steps) > 0
    # validation uses the same seeds every time (ODE): different images after training = the rollout uses the LoRA
    before, after = image_of(run / "images" / "val_step_0.png"), image_of(run / "images" / f"val_step_{steps}.png")
    assert before.shape == after.shape and (before != after).any()
    assert {"val/score/mean", "val/score/max", "val/score/min"} <= set(metrics[steps])


# per diffusers pipeline class: what it needs to draw the kind of sample the run trained on (summary check);
# FluxKontextPipeline would sample and condition at about 1024² (max_area, auto-resize) instead of 32²
PIPELINE_ARGS = {
    "WanPipeline": {"num_frames": 5},
    "WanImageToVideoPipeline": {"num_frames": 5},
    "LTX2Pipeline": {"num_frames": 9},
    "HunyuanVideo15Pipeline": {"num_frames": 5},
    "FluxKontextPipeline": {"max_area": 32 * 32, "_auto_resize": False},
}


def check_summary(run, model, steps: int) -> None:
    """The summary's diffusers lines, executed as printed, load the run's final (trained) LoRA into the model's
    pipeline, and it changes the pipeline's image; the curve is a PNG."""
    import torch
    from PIL import Image

    from verl_omni.pipelines.model_base import get_model_adapter
    from verl_omni.trainer.diffusion.summary import CURVE_FILE, DIFFUSERS_HEADER, SUMMARY_FILE

    lines = (run / SUMMARY_FILE).read_text().splitlines()
    assert lines[0].startswith(f"Flow-GRPO run finished: {steps} of {steps} steps")
    code = "\n".join(line.strip() for line in lines[lines.index(f"  {DIFFUSERS_HEADER}") + 1 :])
    print(code)
    assert f"from_pretrained({str(model)!r})" in code and f"global_step_{steps}" in code
    # a pipeline without a LoRA loader (HunyuanVideo-1.5's) has its transformer load the file
    pipeline_lora = "load_lora_weights(" in code
    assert pipeline_lora or "transformer.load_lora_adapter(" in code
    namespace = {}
    exec(code, namespace)
    pipe = namespace["pipe"]
    lora_owner = pipe if pipeline_lora else pipe.transformer
    active = pipe.get_active_adapters() if pipeline_lora else pipe.transformer.active_adapters()
    assert active, "no LoRA adapter loaded"
    # every transformer of the pipeline (the A14B's two experts) holds the trained LoRA
    for name in ("transformer", "transformer_2"):
        transformer = getattr(pipe, name, None)
        if transformer is None:
            continue
        lora_b = [p for n, p in transformer.named_parameters() if "lora_B" in n]
        assert lora_b and sum(float(p.detach().norm()) for p in lora_b) > 0, f"{name}: the LoRA is not the trained one"
    # the same seed with the adapter on and off: a LoRA bound to no module would draw the same image
    pipe.set_progress_bar_config(disable=True)
    kwargs = dict(prompt="a red cat", height=32, width=32, num_inference_steps=2, output_type="pt")
    kwargs |= PIPELINE_ARGS.get(type(pipe).__name__, {})
    # an editing model: a source image (FLUX.2-klein's pipeline takes an optional one, its adapter none)
    if get_model_adapter(model).max_source_images:
        kwargs["image"] = Image.new("RGB", (32, 32), (200, 40, 40))

    def sample():
        # an image pipeline's output has .images, a video pipeline's .frames
        out = pipe(generator=torch.Generator().manual_seed(0), **kwargs)
        return out.frames if hasattr(out, "frames") else out.images

    tuned = sample()
    lora_owner.disable_lora()
    base = sample()
    assert bool(torch.isfinite(tuned).all()) and (tuned - base).abs().max() > 1e-4
    assert Image.open(run / CURVE_FILE).size == (640, 400)

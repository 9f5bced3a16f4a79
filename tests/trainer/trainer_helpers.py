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


def run_trainer(out: Path, model: Path, prompts, *overrides: str, env: dict | None = None) -> tuple[list[dict], float]:
    """Run the entry point (tiny sizes, then ``overrides``); return the metrics file's records and the wall time."""
    train, val = prompts
    args = [
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.lora.rank=4",
        "actor_rollout_ref.model.lora.alpha=8",
        "actor_rollout_ref.rollout.height=32",
        "actor_rollout_ref.rollout.width=32",
        "actor_rollout_ref.rollout.num_inference_steps=4",
        "actor_rollout_ref.rollout.sde_window_size=2",
        "actor_rollout_ref.rollout.true_cfg_scale=4.0",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=1e-2",
        f"data.train_files={train}",
        f"data.val_files={val}",
        "data.train_batch_size=2",
        "data.shuffle=false",
        "trainer.logger=[console,file]",
        f"trainer.default_local_dir={out}",
        "trainer.val_before_train=true",
        *overrides,
    ]
    env = env or {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
    }
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "verl_omni.trainer.main_flowgrpo", *args],
        cwd=out.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    wall = time.perf_counter() - start
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return read_metrics(out), wall


def read_metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def by_step(records: list[dict]) -> dict[int, dict]:
    return {r["step"]: r["data"] for r in records}

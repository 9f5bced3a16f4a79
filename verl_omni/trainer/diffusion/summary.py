"""The end of a run: a summary and a reward curve, both built from the run directory alone.

At the end of ``fit`` (and on Ctrl-C) the trainer calls :func:`write_summary`. It reads
``metrics.jsonl`` (one ``{"step": N, "data": {...}}`` line per step, verl's file backend), the
image grids under ``images/`` and the checkpoints ``global_step_<N>/actor/lora`` (full fine-tuning:
``global_step_<N>/actor/transformer``, and ``transformer_ema`` with ``actor.ema_decay``), and writes next to
``metrics.jsonl``:

* ``reward_curve.png``: training ``critic/score/mean`` and validation ``val/score/mean`` per step
  (drawn with PIL: matplotlib is not a dependency);
* ``summary.txt``: the algorithm run (its title: ``DanceGRPO run finished``), steps done, wall time,
  validation score first → last, where the metrics, grids and final LoRA (or trained transformer, and its EMA) are,
  and the lines that load it in diffusers (the model adapter's ``lora_file_pipeline``). The same text is logged.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw

from verl_omni.workers.engine.fsdp.checkpoint import (
    LORA_DIR,
    LORA_WEIGHT_NAME,
    TRANSFORMER_DIR,
    TRANSFORMER_EMA_DIR,
    lora_load_calls,
    pipeline_loads_lora,
)

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))

TRAIN_KEY = "critic/score/mean"
VAL_KEY = "val/score/mean"
CURVE_FILE = "reward_curve.png"
SUMMARY_FILE = "summary.txt"
# the LoRA under global_step_<N>: verl's trainer saves the actor in actor/, the engine its LoRA in LORA_DIR
LORA_SUBDIR = Path("actor") / LORA_DIR
# full fine-tuning's checkpoint: the transformer's save_pretrained directory
TRANSFORMER_SUBDIR = Path("actor") / TRANSFORMER_DIR
# the header line above the code that loads the LoRA (tests find the code by it)
DIFFUSERS_HEADER = "load the final LoRA in diffusers:"
# the same for the trained transformer of a full fine-tuning run
TRANSFORMER_HEADER = "load the final transformer in diffusers:"


@dataclass(frozen=True)
class RunRecord:
    """What ``metrics.jsonl`` says about a run: per-step training and validation scores."""

    train: dict[int, float]
    val: dict[int, float]

    @property
    def steps_done(self) -> int:
        return max(self.train, default=0)


def read_run(metrics_file: Path) -> RunRecord:
    """Training and validation mean scores by step (a missing file or step reads as none)."""
    train, val = {}, {}
    if metrics_file.is_file():
        for line in metrics_file.read_text().splitlines():
            if not line.strip():
                continue
            record = json.loads(line)
            data = record.get("data", {})
            if TRAIN_KEY in data:
                train[int(record["step"])] = float(data[TRAIN_KEY])
            if VAL_KEY in data:
                val[int(record["step"])] = float(data[VAL_KEY])
    return RunRecord(train=train, val=val)


def _final(run_dir: Path, subdir: Path, marker: str) -> Path | None:
    """``subdir`` of the newest complete checkpoint holding ``subdir / marker`` (``run_dir.complete_steps``: a save
    cut off is not one)."""
    from verl_omni.trainer.diffusion.run_dir import complete_steps, step_dir

    steps = [step for step in complete_steps(run_dir) if (step_dir(run_dir, step) / subdir / marker).is_file()]
    return step_dir(run_dir, max(steps)) / subdir if steps else None


def final_lora(run_dir: Path) -> Path | None:
    """The LoRA directory of the newest complete checkpoint."""
    return _final(run_dir, LORA_SUBDIR, LORA_WEIGHT_NAME)


def final_transformer(run_dir: Path) -> Path | None:
    """The transformer directory (``save_pretrained``) of the newest complete checkpoint of a full fine-tuning run."""
    return _final(run_dir, TRANSFORMER_SUBDIR, "config.json")


def diffusers_lines(pipeline: str | None, model_path: str, lora: Path | None) -> list[str]:
    """Python that loads ``lora`` onto the base model with ``pipeline`` (none when either is missing)."""
    if pipeline is None or lora is None:
        return []
    lines = [f"from diffusers import {pipeline}", f"pipe = {pipeline}.from_pretrained({str(model_path)!r})"]
    if not pipeline_loads_lora(pipeline):
        # a pipeline without a LoRA loader: its transformer reads the file (the tensors' transformer. prefix dropped)
        file = str(Path(lora) / LORA_WEIGHT_NAME)
        return [*lines, f"pipe.transformer.load_lora_adapter({file!r}, prefix='transformer')"]
    # one call per LoRA file (a two-expert model's second file goes into its transformer_2)
    for kwargs in lora_load_calls(lora):
        args = "".join(f", {key}={value!r}" for key, value in kwargs.items())
        lines.append(f"pipe.load_lora_weights({str(lora)!r}{args})")
    return lines


def transformer_lines(pipeline: str | None, model_path: str, transformer: Path) -> list[str]:
    """Python that loads the trained ``transformer`` directory into the base model's ``pipeline`` (none without one);
    the transformer's class is the one its ``config.json`` names."""
    if pipeline is None:
        return []
    cls = json.loads((transformer / "config.json").read_text())["_class_name"]
    return [
        f"from diffusers import {cls}, {pipeline}",
        f"transformer = {cls}.from_pretrained({str(transformer)!r})",
        f"pipe = {pipeline}.from_pretrained({str(model_path)!r}, transformer=transformer)",
    ]


def summary_text(
    run_dir: Path,
    record: RunRecord,
    total_steps: int,
    wall_s: float,
    model_path: str,
    pipeline: str | None,
    *,
    algorithm: str,
    interrupted: bool,
    stop_reason: str | None = None,
) -> str:
    """The summary's lines (see the module docstring); ``algorithm`` names the algorithm run (its ``display_name``);
    ``stop_reason``: why the run stopped before its last step (the reward guard's reason), its second line."""
    state = f"interrupted after step {record.steps_done}" if interrupted else "finished"
    state = f"stopped after step {record.steps_done}" if stop_reason else state
    lines = [
        f"{algorithm} run {state}: {record.steps_done} of {total_steps} steps in "
        f"{datetime.timedelta(seconds=round(wall_s))} (wall time)"
    ]
    if stop_reason:
        lines.append(f"  stopped: {stop_reason}")
    if record.val:
        first, last = min(record.val), max(record.val)
        lines.append(
            f"  validation score ({VAL_KEY}): {record.val[first]:.6g} at step {first} -> "
            f"{record.val[last]:.6g} at step {last}"
        )
    lines.append(f"  metrics: {run_dir / 'metrics.jsonl'}")
    lines.append(f"  reward curve: {run_dir / CURVE_FILE}")
    grids = sorted((run_dir / "images").glob("val_step_*.png"), key=lambda p: int(re.sub(r"\D", "", p.name) or 0))
    if grids:
        lines.append(f"  image grids: {run_dir / 'images'} ({grids[0].name} ... {grids[-1].name})")
    lora, transformer = final_lora(run_dir), final_transformer(run_dir)
    if transformer and not lora:
        lines.append(f"  final transformer: {transformer}")
        ema = transformer.parent / TRANSFORMER_EMA_DIR
        if (ema / "config.json").is_file():
            lines.append(f"  final EMA transformer (actor.ema_decay, what validation sampled): {ema}")
        header, code = TRANSFORMER_HEADER, transformer_lines(pipeline, model_path, transformer)
    else:
        lines.append(f"  final LoRA: {lora}" if lora else "  final LoRA: none saved (trainer.save_freq <= 0?)")
        header, code = DIFFUSERS_HEADER, diffusers_lines(pipeline, model_path, lora)
    if code:
        lines.append(f"  {header}")
        lines.extend(f"    {line}" for line in code)
    return "\n".join(lines)


def draw_reward_curve(record: RunRecord, path: Path, size: tuple[int, int] = (640, 400)) -> Path:
    """A PNG of the training (blue) and validation (orange) mean score per step, with axis labels."""
    width, height = size
    left, right, top, bottom = 60, 20, 30, 40
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    values = list(record.train.values()) + list(record.val.values())
    steps = list(record.train) + list(record.val)
    low, high = (min(values), max(values)) if values else (0.0, 1.0)
    if high - low < 1e-12:
        low, high = low - 0.5, high + 0.5
    # a margin so that the extreme points are not drawn on the frame
    low, high = low - 0.05 * (high - low), high + 0.05 * (high - low)
    first, last = (min(steps), max(steps)) if steps else (0, 1)
    span = max(last - first, 1)

    def xy(step: int, value: float) -> tuple[float, float]:
        x = left + (step - first) / span * (width - left - right)
        y = top + (high - value) / (high - low) * (height - top - bottom)
        return x, y

    draw.rectangle([left, top, width - right, height - bottom], outline="black")
    draw.text((left, 8), f"blue: train {TRAIN_KEY}   orange: {VAL_KEY}", fill="black")
    draw.text((4, top), f"{high:.3g}", fill="black")
    draw.text((4, height - bottom - 10), f"{low:.3g}", fill="black")
    draw.text((left, height - bottom + 6), f"step {first}", fill="black")
    draw.text((width - right - 60, height - bottom + 6), f"step {last}", fill="black")
    for series, color in ((record.train, (31, 119, 180)), (record.val, (255, 127, 14))):
        points = [xy(s, series[s]) for s in sorted(series)]
        if len(points) > 1:
            draw.line(points, fill=color, width=2)
        for x, y in points:
            draw.ellipse([x - 3, y - 3, x + 3, y + 3], fill=color)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)
    return path


def write_summary(
    run_dir: Path,
    total_steps: int,
    wall_s: float,
    model_path: str,
    pipeline: str | None,
    *,
    algorithm: str,
    interrupted: bool,
    stop_reason: str | None = None,
) -> str:
    """Draw ``reward_curve.png``, write ``summary.txt`` and log the summary; returns its text."""
    record = read_run(run_dir / "metrics.jsonl")
    draw_reward_curve(record, run_dir / CURVE_FILE)
    text = summary_text(
        run_dir,
        record,
        total_steps,
        wall_s,
        model_path,
        pipeline,
        algorithm=algorithm,
        interrupted=interrupted,
        stop_reason=stop_reason,
    )
    (run_dir / SUMMARY_FILE).write_text(text + "\n")
    logger.info("\n%s", text)
    return text

"""What the trainer adds to verl's ``Tracking``: a resumable metrics file, image grids and validation videos."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

logger = logging.getLogger(__name__)


def keep_metrics_until(metrics_file: Path, step: int) -> bytes:
    """The lines of ``metrics_file`` whose ``step`` is <= ``step`` (b"" when there is none or ``step`` is 0).

    verl's file backend opens its file with "w"; a run resumed at ``step`` writes these back first,
    so the file keeps the earlier steps and drops the ones the resumed run will redo.
    """
    if step <= 0 or not metrics_file.is_file():
        return b""
    kept = []
    for number, line in enumerate(metrics_file.read_bytes().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{metrics_file}:{number} is not a JSON line; move the file away to start over") from e
        if record["step"] <= step:
            kept.append(line + b"\n")
    logger.info("resuming %s: kept %d lines up to step %d", metrics_file, len(kept), step)
    return b"".join(kept)


def log_image_grid(tracker, tag: str, grid: torch.Tensor, step: int) -> None:
    """Send a uint8 ``[3, H, W]`` grid to the image-capable backends of ``tracker`` (tensorboard, wandb)."""
    backends = tracker.logger
    if "tensorboard" in backends:
        backends["tensorboard"].writer.add_image(tag, grid, step)
    if "wandb" in backends:
        import wandb

        backends["wandb"].log({tag: wandb.Image(grid.permute(1, 2, 0).numpy())}, step=step)


def log_videos(tracker, tag: str, paths: list[Path], fps: int, step: int) -> None:
    """Send mp4 files to the video-capable backends of ``tracker`` (wandb, from the files: no moviepy needed).
    Tensorboard's ``add_video`` needs moviepy, which the stack does not carry: it gets the frames-side-by-side grid
    (:func:`log_image_grid`) instead."""
    backends = tracker.logger
    if "wandb" in backends:
        import wandb

        videos = [wandb.Video(str(path), fps=fps, format="mp4") for path in paths]
        backends["wandb"].log({tag: videos}, step=step)

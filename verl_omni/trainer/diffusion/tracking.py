"""What the trainer adds to verl's ``Tracking``: a resumable metrics file, image grids and validation videos
(mp4 files to wandb, animated GIFs to tensorboard)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from tensorboard.compat.proto.summary_pb2 import Summary

from verl_omni.utils.video import encode_gif

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


def log_videos(tracker, tag: str, videos: torch.Tensor, paths: list[Path], fps: int, step: int) -> None:
    """Send validation videos (uint8 ``[N, F, 3, H, W]``, written as the mp4s ``paths``) to the video-capable backends
    of ``tracker``: wandb gets the mp4 files, tensorboard an animated GIF per sample under ``<tag>/<i>`` (what its
    ``add_video`` writes, encoded with PIL since ``add_video`` needs moviepy, which the stack does not carry)."""
    backends = tracker.logger
    if "tensorboard" in backends:
        values = [Summary.Value(tag=f"{tag}/{i}", image=_gif_image(video, fps)) for i, video in enumerate(videos)]
        _add_summary(backends["tensorboard"].writer, Summary(value=values), step)
    if "wandb" in backends:
        import wandb

        files = [wandb.Video(str(path), fps=fps, format="mp4") for path in paths]
        backends["wandb"].log({tag: files}, step=step)


def _gif_image(video: torch.Tensor, fps: int) -> Summary.Image:
    """An image summary value whose encoded image is the animated GIF of ``video`` ``[F, 3, H, W]``."""
    height, width = video.shape[2:]
    return Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=encode_gif(video, fps))


def _add_summary(writer, summary, step: int) -> None:
    """Write a ready ``Summary`` proto through torch's ``SummaryWriter``.

    The one private call here: torch's ``SummaryWriter`` (2.11) has no public method taking a ``Summary`` (its
    ``FileWriter`` has ``add_summary``, reached through ``_get_file_writer``, which every ``add_*`` uses and which
    reopens a closed writer); its one video method, ``add_video``, encodes through moviepy. A second public
    ``FileWriter`` on the same directory is no way out: tensorboard reads a run's event files one after another.
    """
    if not hasattr(writer, "_get_file_writer"):
        raise RuntimeError(
            f"this torch ({torch.__version__}) SummaryWriter has no _get_file_writer: update "
            "verl_omni/trainer/diffusion/tracking.py::_add_summary to its way of writing a Summary proto"
        )
    writer._get_file_writer().add_summary(summary, step)

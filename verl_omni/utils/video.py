"""Videos on disk: uint8 ``[F, 3, H, W]`` frames written as H.264 mp4 (PyAV, vLLM-Omni's own dependency)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

logger = logging.getLogger(__name__)


def write_mp4(video: torch.Tensor, path: str | Path, fps: int) -> Path:
    """Write uint8 ``[F, 3, H, W]`` frames to ``path`` (parents created) at ``fps``; returns the path.

    H.264 (``libx264``, yuv420p) where the PyAV build has it, else MPEG-4 Part 2; yuv420p needs even sides,
    so an odd side is cropped by one pixel (the models' sizes are multiples of 16 or 32)."""
    import av

    if video.ndim != 4 or video.shape[1] != 3 or video.dtype != torch.uint8:
        raise ValueError(f"a video must be uint8 [F, 3, H, W], got {video.dtype} {tuple(video.shape)}")
    if fps < 1:
        raise ValueError(f"fps must be >= 1, got {fps}")
    height, width = video.shape[2] // 2 * 2, video.shape[3] // 2 * 2
    frames = video[:, :, :height, :width].permute(0, 2, 3, 1).contiguous().numpy()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    codec = "libx264" if "libx264" in av.codecs_available else "mpeg4"
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())
    return path


def read_frames(path: str | Path) -> torch.Tensor:
    """The frames of a video file as uint8 ``[F, 3, H, W]`` (what a user's player decodes; tests read mp4s back)."""
    import av

    with av.open(str(path)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    return torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2).contiguous()

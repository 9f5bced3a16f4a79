"""Videos as files: uint8 ``[F, 3, H, W]`` frames as H.264 mp4 (PyAV, a dependency of vLLM-Omni declared in
``pyproject.toml``; its wheels bundle FFmpeg with libx264) or as an animated GIF (PIL), and mp4s read back as frames.

One home for every user: validation writes a file per sample (:func:`write_mp4`) and logs a GIF to tensorboard
(:func:`encode_gif`), the HTTP video scorer sends the bytes (:func:`encode_mp4`). PyAV is imported on first use only.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch

# x264 constant rate factor: 0 is lossless, 18 is visually lossless, 23 is x264's default
DEFAULT_CRF = 18


def _check_frames(frames: torch.Tensor, fps: int) -> None:
    if frames.dtype != torch.uint8 or frames.ndim != 4 or frames.shape[1] != 3 or frames.shape[0] == 0:
        raise ValueError(f"frames must be uint8 [F, 3, H, W] with F >= 1, got {frames.dtype} {tuple(frames.shape)}")
    if fps < 1:
        raise ValueError(f"fps must be >= 1, got {fps}")


def encode_mp4(frames: torch.Tensor, fps: int, crf: int = DEFAULT_CRF) -> bytes:
    """The bytes of an H.264 (yuv420p) mp4 of uint8 frames ``[F, 3, H, W]`` at ``fps`` frames per second.

    yuv420p is what every player and video reader decodes; it halves the chroma resolution, so
    ``H`` and ``W`` must be even (an odd size is an error: crop, as :func:`write_mp4` does, or send frames).
    """
    _check_frames(frames, fps)
    height, width = frames.shape[2:]
    if height % 2 or width % 2:
        raise ValueError(f"an H.264 mp4 needs an even frame size, got {height}x{width}")
    import av

    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"crf": str(crf)}
        for frame in frames.permute(0, 2, 3, 1).contiguous().numpy():
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())
    return buffer.getvalue()


def encode_gif(frames: torch.Tensor, fps: int) -> bytes:
    """The bytes of an animated GIF of uint8 frames ``[F, 3, H, W]`` at ``fps``, looping forever: what tensorboard's
    video panel shows (its ``add_video`` writes a GIF too, but through moviepy, which the stack does not carry).

    GIF stores a frame's duration in hundredths of a second, so the rate is rounded (24 fps plays at 25); each frame
    gets its own 256-colour palette (PIL's adaptive quantisation). PIL merges consecutive identical frames into one
    longer frame, so a still video has fewer GIF frames but the same length.
    """
    _check_frames(frames, fps)
    from PIL import Image

    images = [Image.fromarray(frame) for frame in frames.permute(0, 2, 3, 1).contiguous().numpy()]
    buffer = io.BytesIO()
    images[0].save(buffer, format="GIF", save_all=True, append_images=images[1:], duration=1000 / fps, loop=0)
    return buffer.getvalue()


def write_mp4(video: torch.Tensor, path: str | Path, fps: int) -> Path:
    """Write uint8 ``[F, 3, H, W]`` frames to ``path`` (parents created) at ``fps``; returns the path. An odd side
    is cropped by one pixel (yuv420p needs even sides; the models' sizes are multiples of 16 or 32)."""
    if video.ndim != 4:
        raise ValueError(f"a video must be uint8 [F, 3, H, W], got {video.dtype} {tuple(video.shape)}")
    height, width = video.shape[2] // 2 * 2, video.shape[3] // 2 * 2
    data = encode_mp4(video[:, :, :height, :width], fps)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def read_frames(path: str | Path) -> torch.Tensor:
    """The frames of a video file as uint8 ``[F, 3, H, W]`` (what a user's player decodes; tests read mp4s back)."""
    import av

    with av.open(str(path)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    return torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2).contiguous()

"""Video files from uint8 frame tensors: H.264 mp4 in memory, through PyAV.

PyAV (``av``) is a dependency of vLLM-Omni and is declared in ``pyproject.toml``; it bundles FFmpeg
with libx264, so nothing else has to be installed. It is imported on first use only.
"""

from __future__ import annotations

import io
import logging

import torch

logger = logging.getLogger(__name__)

# x264 constant rate factor: 0 is lossless, 18 is visually lossless, 23 is x264's default
DEFAULT_CRF = 18


def encode_mp4(frames: torch.Tensor, fps: int, crf: int = DEFAULT_CRF) -> bytes:
    """The bytes of an H.264 (yuv420p) mp4 of uint8 frames ``[F, 3, H, W]`` at ``fps`` frames per second.

    yuv420p is what every player and video reader decodes; it halves the chroma resolution, so
    ``H`` and ``W`` must be even (an odd size is an error: crop, or send the frames instead).
    """
    if frames.dtype != torch.uint8 or frames.ndim != 4 or frames.shape[1] != 3 or frames.shape[0] == 0:
        raise ValueError(f"frames must be uint8 [F, 3, H, W] with F >= 1, got {frames.dtype} {tuple(frames.shape)}")
    height, width = frames.shape[2:]
    if height % 2 or width % 2:
        raise ValueError(f"an H.264 mp4 needs an even frame size, got {height}x{width}")
    if fps < 1:
        raise ValueError(f"fps must be >= 1, got {fps}")
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

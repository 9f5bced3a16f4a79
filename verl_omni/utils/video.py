"""Videos as files: uint8 ``[F, 3, H, W]`` frames as H.264 mp4 (PyAV, a dependency of vLLM-Omni declared in
``pyproject.toml``; its wheels bundle FFmpeg with libx264) or as an animated GIF (PIL), and mp4s read back as frames.
A video with sound (LTX-2) carries its waveform as an AAC track of the same mp4 (FFmpeg's native encoder); a player
plays both, :func:`read_audio` reads it back.

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


def _check_audio(audio: torch.Tensor, sample_rate: int | None) -> torch.Tensor:
    """``audio`` as float32 ``[channels, samples]`` (a ``[samples]`` waveform is mono), 1 or 2 channels."""
    wave = audio[None] if audio.ndim == 1 else audio
    if wave.ndim != 2 or wave.shape[0] not in (1, 2) or wave.shape[1] == 0 or not wave.is_floating_point():
        raise ValueError(
            f"audio must be a float waveform [samples] or [channels, samples] of 1 or 2 channels, got {audio.dtype} "
            f"{tuple(audio.shape)}"
        )
    if not sample_rate or sample_rate < 1:
        raise ValueError(f"audio needs its sample_rate (Hz >= 1), got {sample_rate!r}")
    return wave.detach().float().cpu().clamp(-1, 1)


def encode_mp4(
    frames: torch.Tensor,
    fps: int,
    crf: int = DEFAULT_CRF,
    audio: torch.Tensor | None = None,
    sample_rate: int | None = None,
) -> bytes:
    """The bytes of an H.264 (yuv420p) mp4 of uint8 frames ``[F, 3, H, W]`` at ``fps`` frames per second and,
    given ``audio`` (float ``[samples]`` or ``[channels, samples]`` in [-1, 1], 1 or 2 channels), its AAC track at
    ``sample_rate`` Hz.

    yuv420p is what every player and video reader decodes; it halves the chroma resolution, so
    ``H`` and ``W`` must be even (an odd size is an error: crop, as :func:`write_mp4` does, or send frames).
    """
    _check_frames(frames, fps)
    wave = None if audio is None else _check_audio(audio, sample_rate)
    height, width = frames.shape[2:]
    if height % 2 or width % 2:
        raise ValueError(f"an H.264 mp4 needs an even frame size, got {height}x{width}")
    import av

    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"crf": str(crf)}
        sound = None
        if wave is not None:
            # added before anything is muxed: the container writes its header with every stream at the first packet
            sound = container.add_stream("aac", rate=int(sample_rate))
            sound.layout = "mono" if wave.shape[0] == 1 else "stereo"
        for frame in frames.permute(0, 2, 3, 1).contiguous().numpy():
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())
        if sound is not None:
            # planar float samples; the encoder cuts them into its own frame size
            chunk = av.AudioFrame.from_ndarray(wave.contiguous().numpy(), format="fltp", layout=sound.layout.name)
            chunk.sample_rate = int(sample_rate)
            container.mux(sound.encode(chunk))
            container.mux(sound.encode())
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


def write_mp4(
    video: torch.Tensor,
    path: str | Path,
    fps: int,
    audio: torch.Tensor | None = None,
    sample_rate: int | None = None,
) -> Path:
    """Write uint8 ``[F, 3, H, W]`` frames (and ``audio`` at ``sample_rate``, :func:`encode_mp4`) to ``path`` (parents
    created) at ``fps``; returns the path. An odd side is cropped by one pixel (yuv420p needs even sides; the
    models' sizes are multiples of 16 or 32)."""
    if video.ndim != 4:
        raise ValueError(f"a video must be uint8 [F, 3, H, W], got {video.dtype} {tuple(video.shape)}")
    height, width = video.shape[2] // 2 * 2, video.shape[3] // 2 * 2
    data = encode_mp4(video[:, :, :height, :width], fps, audio=audio, sample_rate=sample_rate)
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


def read_audio(path: str | Path) -> tuple[torch.Tensor, int]:
    """The sound track of a video file: float32 ``[channels, samples]`` and its rate (Hz), as a player decodes it (an
    AAC track starts with the encoder's priming samples). A file without one is an error."""
    import av

    with av.open(str(path)) as container:
        if not container.streams.audio:
            raise ValueError(f"{path} has no audio stream")
        rate = int(container.streams.audio[0].rate)
        chunks = [f.to_ndarray() for f in container.decode(audio=0)]
    return torch.from_numpy(np.concatenate(chunks, axis=1)).float(), rate

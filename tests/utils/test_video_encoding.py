"""``utils.video.encode_mp4``: the mp4 it writes is read back by a video reader (PyAV) with its frames and rate."""

import io

import av
import numpy as np
import pytest
import torch

from verl_omni.utils.video import encode_mp4


def smooth_video(frames=7, h=32, w=48) -> torch.Tensor:
    """Gradients sliding 3 px per frame (no hard edge, which yuv420p's half-size chroma would blur)."""
    x = torch.arange(w, dtype=torch.float32)
    y = torch.arange(h, dtype=torch.float32)[:, None]
    video = []
    for t in range(frames):
        red = (x + 3 * t) / (w + 3 * frames) * 255
        green = y / h * 255 + 0 * x
        video.append(torch.stack([red.expand(h, w), green, 255 - red.expand(h, w)]))
    return torch.stack(video).round().to(torch.uint8)


def test_an_encoded_mp4_decodes_to_the_same_frames_at_the_same_rate():
    video = smooth_video()
    with av.open(io.BytesIO(encode_mp4(video, fps=6))) as container:
        stream = container.streams.video[0]
        assert (stream.codec_context.name, stream.average_rate) == ("h264", 6)
        frames = np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(stream)])
    assert frames.shape == (7, 32, 48, 3)
    error = np.abs(frames.astype(int) - video.permute(0, 2, 3, 1).numpy().astype(int))
    # lossy (CRF 18, 4:2:0 chroma): a few levels; a channel swap or a shifted frame would be far off
    assert error.mean() < 4 and error.max() < 16


@pytest.mark.parametrize(
    "frames,fps,message",
    [
        (torch.zeros(2, 3, 8, 8), 8, "uint8"),
        (torch.zeros(3, 8, 8, dtype=torch.uint8), 8, r"\[F, 3, H, W\]"),
        (torch.zeros(0, 3, 8, 8, dtype=torch.uint8), 8, "F >= 1"),
        (torch.zeros(2, 3, 8, 7, dtype=torch.uint8), 8, "even frame size, got 8x7"),
        (torch.zeros(2, 3, 8, 8, dtype=torch.uint8), 0, "fps must be >= 1"),
    ],
)
def test_encode_mp4_refuses_what_it_cannot_write(frames, fps, message):
    with pytest.raises(ValueError, match=message):
        encode_mp4(frames, fps)

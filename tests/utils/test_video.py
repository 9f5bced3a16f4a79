"""Validation videos: uint8 frames written as mp4 decode back to the same frames (within the codec's loss); the GIF
encoder refuses what is not a video (what tensorboard reads of it: ``tests/trainer/diffusion/test_tracking.py``)."""

import pytest
import torch

from verl_omni.utils.video import encode_gif, read_frames, write_mp4


def test_an_mp4_decodes_back_to_its_frames_in_order(tmp_path):
    # 5 frames of 32x48, each a flat colour distinct from the others (lossy codecs keep flat colours)
    colours = torch.tensor([[200, 30, 30], [30, 200, 30], [30, 30, 200], [200, 200, 30], [30, 200, 200]])
    video = colours.to(torch.uint8).view(5, 3, 1, 1).expand(5, 3, 32, 48).contiguous()
    path = write_mp4(video, tmp_path / "sub" / "sample_0.mp4", fps=24)
    frames = read_frames(path)
    assert frames.shape == (5, 3, 32, 48)
    assert (frames.int() - video.int()).abs().float().mean() < 8
    with pytest.raises(ValueError, match=r"uint8 \[F, 3, H, W\]"):
        write_mp4(video[0], tmp_path / "bad.mp4", fps=24)


@pytest.mark.parametrize(
    "frames,fps,message",
    [
        (torch.zeros(2, 3, 8, 8), 8, "uint8"),
        (torch.zeros(0, 3, 8, 8, dtype=torch.uint8), 8, "F >= 1"),
        (torch.zeros(2, 3, 8, 8, dtype=torch.uint8), 0, "fps must be >= 1"),
    ],
)
def test_encode_gif_refuses_what_is_not_a_video(frames, fps, message):
    with pytest.raises(ValueError, match=message):
        encode_gif(frames, fps)

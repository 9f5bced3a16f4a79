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


def test_an_mp4_with_sound_carries_its_waveform_as_an_audio_track(tmp_path):
    """A video model with sound (LTX-2) writes its waveform into the same mp4: PyAV reads back a video stream and an
    AAC stream at the waveform's rate and channels, whose samples (past the encoder's priming delay) follow it."""
    import av

    from verl_omni.utils.video import read_audio

    rate, seconds = 24_000, 0.5
    t = torch.arange(int(rate * seconds)) / rate
    # a 440 Hz tone left, 880 Hz right
    wave = 0.5 * torch.stack([torch.sin(2 * torch.pi * 440 * t), torch.sin(2 * torch.pi * 880 * t)])
    frames = torch.randint(0, 256, (12, 3, 32, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    path = write_mp4(frames, tmp_path / "a.mp4", fps=24, audio=wave, sample_rate=rate)

    with av.open(str(path)) as container:
        assert [s.type for s in container.streams] == ["video", "audio"]
        assert container.streams.audio[0].codec_context.name == "aac"
    assert read_frames(path).shape == frames.shape
    decoded, decoded_rate = read_audio(path)
    assert decoded_rate == rate and decoded.shape[0] == 2 and decoded.shape[1] >= wave.shape[1]
    # each channel's dominant frequency survives the lossy codec
    spectrum = torch.fft.rfft(decoded[:, : wave.shape[1]]).abs()
    peaks = spectrum.argmax(dim=1).float() * rate / wave.shape[1]
    assert torch.allclose(peaks, torch.tensor([440.0, 880.0]), atol=5)
    # without sound: no audio stream
    silent = write_mp4(frames, tmp_path / "b.mp4", fps=24)
    with pytest.raises(ValueError, match="has no audio stream"):
        read_audio(silent)
    with pytest.raises(ValueError, match=r"audio needs its sample_rate"):
        write_mp4(frames, tmp_path / "c.mp4", fps=24, audio=wave)
    with pytest.raises(ValueError, match=r"1 or 2 channels, got torch.float32 \(3, 12000\)"):
        write_mp4(frames, tmp_path / "c.mp4", fps=24, audio=torch.zeros(3, 12_000), sample_rate=rate)

"""The resumable metrics file: lines up to the resumed step survive verl's truncating file backend."""

import json

import pytest

from verl_omni.trainer.diffusion.tracking import keep_metrics_until


def test_keeps_steps_up_to_the_resumed_one_and_drops_later_ones(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "data": {"x": s}}) + "\n" for s in (0, 1, 2, 3)))
    kept = keep_metrics_until(path, 2)
    assert [json.loads(line)["step"] for line in kept.splitlines()] == [0, 1, 2]
    assert keep_metrics_until(path, 0) == b""
    assert keep_metrics_until(tmp_path / "missing.jsonl", 5) == b""


def test_a_corrupt_line_names_the_file_and_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "data": {}}\nnot json\n')
    with pytest.raises(ValueError, match="metrics.jsonl:2"):
        keep_metrics_until(path, 3)


def test_validation_videos_reach_tensorboard_as_animated_gifs(tmp_path, monkeypatch):
    """Written by verl's ``Tracking`` (torch's ``SummaryWriter``), read back by tensorboard's own event loader as its
    images plugin sees them, each GIF decoded by PIL: one animated GIF per sample, every frame kept."""
    import io

    import torch
    from PIL import Image, ImageSequence
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util
    from verl.utils.tracking import Tracking

    from verl_omni.trainer.diffusion.tracking import log_videos

    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "tensorboard"))
    tracker = Tracking(project_name="p", experiment_name="e", default_backend=["tensorboard"])
    # 2 samples of 5 frames of 24x40: sample i, frame f is a flat colour no other frame has
    colours = torch.arange(2 * 5 * 3).view(2, 5, 3, 1, 1) * 17 % 256
    videos = colours.to(torch.uint8).expand(2, 5, 3, 24, 40).contiguous()
    log_videos(tracker, "val/videos", videos, paths=[], fps=10, step=3)
    tracker.finish()

    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert sorted(events.Tags()["tensors"]) == ["val/videos/0", "val/videos/1"]
    for i in range(2):
        assert events.SummaryMetadata(f"val/videos/{i}").plugin_data.plugin_name == "images"
        (event,) = events.Tensors(f"val/videos/{i}")
        assert event.step == 3
        width, height, encoded = tensor_util.make_ndarray(event.tensor_proto)
        assert (int(width), int(height)) == (40, 24)
        gif = Image.open(io.BytesIO(encoded))
        assert gif.format == "GIF" and gif.size == (40, 24)
        frames = [frame.convert("RGB") for frame in ImageSequence.Iterator(gif)]
        assert len(frames) == 5 and gif.info["duration"] == 100
        pixels = [frame.getpixel((0, 0)) for frame in frames]
        assert pixels == [tuple(colour) for colour in colours[i, :, :, 0, 0].tolist()]

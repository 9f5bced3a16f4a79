"""The resumable metrics file: lines up to the resumed step survive verl's truncating file backend."""

import json

import pytest

from verl_omni.trainer.flowgrpo.tracking import keep_metrics_until


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

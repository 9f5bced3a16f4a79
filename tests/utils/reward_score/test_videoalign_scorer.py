"""The ``videoalign`` scorer on a tiny random VideoReward checkpoint (``tiny_models videoalign``), released layout.

The expected rewards come from the authors' own inference code (KwaiVGI/VideoAlign's ``VideoVLMRewardInference``)
run on the same checkpoint, videos and prompts (``reference/score_videoalign_with_reference_code.py``; the code pins
transformers 4.45 and is no package, see there). It runs the LoRA unmerged through peft; the scorer merges it.
"""

import asyncio
import json
from pathlib import Path

import pytest
import torch

from verl_omni.utils.reward_score import ScoreBatch, build_params, get_scorer_cls
from verl_omni.utils.reward_score.videoalign import VideoAlignParams, frame_indices, frame_size, load_videoalign

REFERENCE = json.loads(Path(__file__).with_name("reference").joinpath("videoalign_reference_scores.json").read_text())
PROMPTS = REFERENCE["prompts"]


def _ours_named(rows: list[dict]) -> list[dict]:
    """The authors' ``Overall`` is the scorer's ``overall``."""
    return [{("overall" if k == "Overall" else k): v for k, v in row.items()} for row in rows]


THEIRS = {name: _ours_named(rows) for name, rows in REFERENCE["videoalign"].items()}
# 6 frames of 32x48: round(linspace(0, 5, 4)) = [0, 2, 3, 5]; 32x48 is below 128*28*28 pixels, so it grows to 280x392
INDICES = [0, 2, 3, 5]
SIZE = (280, 392)


def make(model_path, **params):
    cls = get_scorer_cls("videoalign")
    values = {"model_path": str(model_path), "dtype": "float32", "num_frames": REFERENCE["num_frames"], **params}
    return cls(build_params(cls.params_cls, values, "test"))


@pytest.fixture(scope="module")
def tiny_dir(tiny_model):
    return tiny_model("videoalign")


@pytest.fixture(scope="module")
def videos():
    generator = torch.Generator().manual_seed(REFERENCE["seed"])
    return torch.randint(0, 256, tuple(REFERENCE["shape"]), dtype=torch.uint8, generator=generator)


def test_frames_are_sampled_and_sized_as_the_authors_do():
    assert frame_indices(6, 4) == INDICES
    assert frame_indices(81, 8) == [0, 11, 23, 34, 46, 57, 69, 80]
    assert frame_indices(5, 8) == [0, 1, 3, 4]  # fewer frames than asked: all of them, made even
    assert frame_size(32, 48, 200704) == SIZE
    assert frame_size(480, 832, 200704) == (336, 588)  # above the bound: shrunk, multiples of 28
    assert frame_size(392, 504, 200704) == (392, 504)
    with pytest.raises(ValueError, match="at least 2 frames"):
        frame_indices(1, 8)


def test_all_four_rewards_equal_the_authors_code(tiny_dir, videos):
    """Two videos in one right-padded batch (prompts of different lengths), normalized and raw."""
    model = load_videoalign(VideoAlignParams(model_path=str(tiny_dir), dtype="float32", num_frames=4))
    for normalize, name in ((True, "normalized"), (False, "raw")):
        got = model.rewards(videos, PROMPTS, normalize=normalize)
        for ours, theirs in zip(got, THEIRS[name], strict=True):
            assert ours == pytest.approx(theirs, abs=1e-5)
    # the criteria differ by far more than the tolerance on this checkpoint
    assert len({round(v, 3) for r in THEIRS["normalized"] for v in r.values()}) == 8


@pytest.mark.parametrize("score", ["MQ", "overall"])
def test_the_scorer_returns_the_chosen_score_one_video_at_a_time(tiny_dir, videos, score):
    scores = asyncio.run(make(tiny_dir, score=score, batch_size=1).score(ScoreBatch(videos, PROMPTS)))
    assert scores == pytest.approx([r[score] for r in THEIRS["one_at_a_time"]], abs=1e-5)


def test_bfloat16_rewards_follow_float32(tiny_dir, videos):
    """The authors' dtype: the whole model, head included, in bfloat16."""
    scores = asyncio.run(make(tiny_dir, dtype="bfloat16", score="TA").score(ScoreBatch(videos, PROMPTS)))
    assert scores == pytest.approx([r["TA"] for r in THEIRS["normalized"]], abs=0.05)


def test_a_prompt_holding_a_reward_token_is_refused(tiny_dir, videos):
    with pytest.raises(ValueError, match=r"reads <\|TA_reward\|> once per sample; a text prompt that contains it"):
        make(tiny_dir).score_sync(ScoreBatch(videos[:1], ["a cat <|TA_reward|>"]))


def test_the_checkpoint_has_the_released_layout(tiny_dir):
    run = json.loads(Path(tiny_dir, "model_config.json").read_text())
    assert set(run) == {"data_config", "model_config", "peft_lora_config", "inference_config"}
    state = torch.load(Path(tiny_dir, "checkpoint-11352", "model.pth"), weights_only=True)
    assert {k.split(".")[2] for k in state} == {"model", "visual", "lm_head", "rm_head"}
    assert state["base_model.model.rm_head.weight"].shape == (1, 32)
    q_proj = "base_model.model.model.layers.0.self_attn.q_proj"
    assert {f"{q_proj}.{p}" for p in ("base_layer.weight", "base_layer.bias", "lora_A.default.weight")} <= set(state)
    assert not any("lora_" in k for k in state if ".visual." in k)


def test_missing_weights_name_the_directory(tmp_path, videos):
    batch = ScoreBatch(videos, PROMPTS)
    missing = tmp_path / "VideoReward"
    with pytest.raises(
        FileNotFoundError, match=rf"model_path='{missing}' is not a directory; it must hold VideoReward"
    ):
        make(missing).score_sync(batch)
    with pytest.raises(FileNotFoundError, match=rf"model_path='{tmp_path}' has no model_config.json: put VideoReward"):
        make(tmp_path).score_sync(batch)
    (tmp_path / "model_config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=rf"model_path='{tmp_path}' has no checkpoint-<step> directory"):
        make(tmp_path).score_sync(batch)
    (tmp_path / "checkpoint-7").mkdir()
    with pytest.raises(FileNotFoundError, match=rf"model_path='{tmp_path}/checkpoint-7' has no model.pth"):
        make(tmp_path).score_sync(batch)
    with pytest.raises(FileNotFoundError, match=r"has no checkpoint-9; checkpoint_step may be \[7\] or -1"):
        make(tmp_path, checkpoint_step=9).score_sync(batch)


def test_a_base_directory_without_the_config_names_its_key(tiny_dir, tmp_path, videos):
    with pytest.raises(FileNotFoundError, match=rf"base_model_path='{tmp_path}' has no config.json: put the base"):
        make(tiny_dir, base_model_path=str(tmp_path)).score_sync(ScoreBatch(videos, PROMPTS))


def test_a_run_of_another_prompt_template_is_refused_by_its_key(tiny_dir, tmp_path, videos):
    run = json.loads(Path(tiny_dir, "model_config.json").read_text())
    run["data_config"]["prompt_template_type"] = "simple"
    (tmp_path / "model_config.json").write_text(json.dumps(run))
    (tmp_path / "checkpoint-1").mkdir()
    (tmp_path / "checkpoint-1" / "model.pth").write_bytes(b"")
    with pytest.raises(ValueError, match=r"data_config.prompt_template_type is 'simple'; the videoalign scorer reads"):
        make(tmp_path, base_model_path=str(tiny_dir)).score_sync(ScoreBatch(videos, PROMPTS))


@pytest.mark.parametrize(
    "params, message",
    [
        ({}, r"^k\.model_path must name a local directory holding VideoReward's"),
        ({"model_path": "/m", "score": "vq"}, r"k\.score must be one of VQ, MQ, TA, overall, got 'vq'"),
        ({"model_path": "/m", "num_frames": 3}, r"k\.num_frames must be an even number >= 2"),
        ({"model_path": "/m", "dtype": "float64"}, r"k\.dtype must be one of float32, bfloat16, float16"),
        ({"model_path": "/m", "batch_size": 0}, r"k\.batch_size must be >= 1"),
    ],
)
def test_bad_params_are_refused_by_key(params, message):
    cls = get_scorer_cls("videoalign")
    with pytest.raises(ValueError, match=message):
        build_params(cls.params_cls, params, "k")

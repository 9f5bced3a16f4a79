"""DiffusionRewardManager in-process: DataProto in, per-sample rewards and extra info out."""

import asyncio
import io
import math

import numpy as np
import pytest
import torch
from reward_loop_helpers import make_config, make_data, make_images
from verl.experimental.reward_loop.reward_manager import get_reward_manager_cls

from verl_omni.reward_loop import DiffusionRewardManager
from verl_omni.reward_loop.reward_loop import diffusion_manager_cls
from verl_omni.reward_loop.reward_manager import ground_truth_text
from verl_omni.utils.dataset.prompt_dataset import prompt_text
from verl_omni.utils.reward_score import ScorerError
from verl_omni.utils.reward_score.jpeg import jpeg_size_ratio


def ocr_entry(url, required):
    params = {"url": url, "model": "vlm", "max_retries": 1, "backoff_s": 0.01, "max_backoff_s": 0.01}
    return {"type": "ocr", "required": required, "params": params}


def test_diffusion_is_registered_in_verls_reward_manager_registry():
    assert get_reward_manager_cls("diffusion") is DiffusionRewardManager
    assert diffusion_manager_cls(make_config(scorers=[{"type": "jpeg_compressibility"}])) is DiffusionRewardManager


def test_a_text_reward_manager_is_refused_by_name():
    config = make_config(scorers=[{"type": "jpeg_compressibility"}])
    config.reward.reward_manager.name = "naive"
    with pytest.raises(ValueError, match="reward.reward_manager.name='naive'.*cannot score images"):
        diffusion_manager_cls(config)


def test_run_batch_scores_each_sample_and_marks_excluded_optional_scorer(refusing_url):
    config = make_config(
        scorers=[
            {"type": "jpeg_compressibility", "name": "jpeg", "weight": 2.0},
            ocr_entry(refusing_url, required=False),
        ]
    )
    images = make_images(3)
    chat = [{"role": "system", "content": "be nice"}, {"role": "user", "content": 'a sign "hi"'}]
    data = make_data(images, [chat, 'sign "a"', 'sign "b"'], truths=["hi", None, "b"])
    out = asyncio.run(DiffusionRewardManager(config).run_batch(data))
    expected = [-jpeg_size_ratio(image, 95) for image in images]
    assert [o["reward_score"] for o in out] == pytest.approx(expected)
    assert [o["reward_extra_info"]["reward/jpeg"] for o in out] == pytest.approx(expected)
    assert all(math.isnan(o["reward_extra_info"]["reward/ocr"]) for o in out)
    assert out[0]["reward_score"] > out[1]["reward_score"]


def test_a_model_scorers_score_reaches_the_reward_with_the_samples_prompt(tiny_model):
    """The tiny HPSv3 (a Qwen2-VL reward model) scores through the manager: the chat prompt's user text, each image."""
    from verl_omni.utils.reward_score.hpsv3 import HpsV3Params, load_hpsv3

    params = {"model_path": str(tiny_model("hpsv3")), "dtype": "float32"}
    config = make_config(scorers=[{"type": "hpsv3", "name": "hps", "weight": 1.0, "params": params}])
    images = make_images(2)
    data = make_data(images, [[{"role": "user", "content": "a red car"}], "a cat near the tree"])
    out = asyncio.run(DiffusionRewardManager(config).run_batch(data))
    expected = load_hpsv3(HpsV3Params(**params)).score(images, ["a red car", "a cat near the tree"])
    assert [o["reward_score"] for o in out] == pytest.approx(expected, abs=1e-6)
    assert [o["reward_extra_info"]["reward/hps"] for o in out] == pytest.approx(expected, abs=1e-6)
    assert expected[0] != pytest.approx(expected[1], abs=1e-4)


def test_required_scorer_failure_raises_with_scorer_name(refusing_url):
    config = make_config(scorers=[{"type": "jpeg_compressibility"}, ocr_entry(refusing_url, required=True)])
    data = make_data(make_images(1), ['sign "a"'])
    with pytest.raises(ScorerError, match=r"required scorer 'ocr' failed: .*after 2 attempts"):
        asyncio.run(DiffusionRewardManager(config).run_single(data))


def test_bad_images_and_missing_keys_are_named_errors():
    manager = DiffusionRewardManager(make_config(scorers=[{"type": "jpeg_compressibility"}]))
    with pytest.raises(ValueError, match="uint8"):
        asyncio.run(manager.run_batch(make_data(make_images(1).float(), ["p"])))
    with pytest.raises(ValueError, match=r"\[B, 3, H, W\]"):
        asyncio.run(manager.run_batch(make_data(make_images(1)[:, :1], ["p"])))
    data = make_data(make_images(1), ["p"])
    data.batch.rename_key_("responses", "images")
    with pytest.raises(KeyError, match="'responses' .*reward.diffusion.image_key"):
        asyncio.run(manager.run_batch(data))
    with pytest.raises(ValueError, match="run_single scores one sample"):
        asyncio.run(manager.run_single(make_data(make_images(2), ["a", "b"])))


def test_rm_scores_hold_one_scalar_per_image():
    data = make_data(make_images(2), ["a", "b"])
    scores = DiffusionRewardManager.assemble_rm_scores(data, [0.5, -1.0])
    assert scores.dtype == torch.float32 and scores.tolist() == [0.5, -1.0]


def test_prompt_and_ground_truth_extraction():
    parts = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "a cat"}]}]
    assert prompt_text(np.array(parts, dtype=object), "raw_prompt") == "a cat"
    assert prompt_text("plain", "raw_prompt") == "plain"
    with pytest.raises(ValueError, match=r"non_tensor_batch\['raw_prompt'\]"):
        prompt_text(3, "raw_prompt")
    assert ground_truth_text({"ground_truth": "x"}, "reward_model") == "x"
    assert ground_truth_text(None, "reward_model") is None
    with pytest.raises(ValueError, match=r"non_tensor_batch\['reward_model'\]"):
        ground_truth_text(7, "reward_model")


def test_source_images_come_from_the_prompt_chat_turn_in_verls_forms(tmp_path):
    from PIL import Image

    pixels = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3) * 10
    path = tmp_path / "source.png"
    Image.fromarray(pixels).save(path)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    user = {
        "role": "user",
        "content": [
            {"type": "image", "image": Image.fromarray(pixels)},
            {"type": "image", "image": str(path)},
            {"type": "image", "bytes": buffer.getvalue()},
            {"type": "text", "text": "make it red"},
        ],
    }
    config = make_config(scorers=[{"type": "brightness"}])
    batch = DiffusionRewardManager(config).to_score_batch(make_data(make_images(2), [[user], "a cat"]))
    expected = torch.from_numpy(pixels).permute(2, 0, 1)
    assert batch.prompts == ["make it red", "a cat"]
    assert len(batch.sources[0]) == 3 and all(torch.equal(s, expected) for s in batch.sources[0])
    assert batch.sources[1] == []
    # text-to-image only: no sources at all
    assert DiffusionRewardManager(config).to_score_batch(make_data(make_images(1), ["a"])).sources is None


def test_source_images_key_reads_a_column_and_names_a_missing_file_or_key(tmp_path):
    config = make_config(scorers=[{"type": "brightness"}], source_images_key="multi_modal_data")
    manager = DiffusionRewardManager(config)
    data = make_data(make_images(2), ["a", "b"])
    with pytest.raises(KeyError, match="no source images under 'multi_modal_data'.*source_images_key"):
        manager.to_score_batch(data)
    image = torch.randint(0, 256, (3, 4, 6), dtype=torch.uint8)
    data.non_tensor_batch["multi_modal_data"] = np.array([{"image": [image]}, None], dtype=object)
    batch = manager.to_score_batch(data)
    assert torch.equal(batch.sources[0][0], image) and batch.sources[1] == []
    data.non_tensor_batch["multi_modal_data"] = np.array([[str(tmp_path / "gone.png")], []], dtype=object)
    with pytest.raises(
        ValueError, match=r"non_tensor_batch\['multi_modal_data'\]\[0\]\[0\]: cannot read the image .*gone.png"
    ):
        manager.to_score_batch(data)


def test_video_samples_flow_through_the_manager_with_per_frame_scorers():
    videos = torch.stack([torch.full((4, 3, 8, 8), v, dtype=torch.uint8) for v in (51, 204)])
    videos[1, 1] = 0
    config = make_config(
        scorers=[{"type": "brightness", "frame_stride": 2}, {"type": "temporal_consistency", "name": "tc"}]
    )
    out = asyncio.run(DiffusionRewardManager(config).run_batch(make_data(videos, ["a", "b"])))
    assert [o["reward_extra_info"]["reward/brightness"] for o in out] == pytest.approx([0.2, 0.8])
    assert [o["reward_extra_info"]["reward/tc"] for o in out] == pytest.approx([1.0, 1 - (2 * 204 / 3) / 255])


def test_a_videos_reward_is_the_mean_of_its_frames_scored_as_images():
    """Videos ``[B, F, 3, H, W]`` (Wan2.2's rollout): the image scorers score every frame with the video's prompt;
    the video's reward and per-scorer value are the means over its frames. (The video scorers proper, per-frame
    stride, temporal consistency, HTTP video, are the reward issue's.)"""
    config = make_config(scorers=[{"type": "jpeg_compressibility", "name": "jpeg"}])
    frames = make_images(6).view(2, 3, 3, 32, 32)
    out = asyncio.run(DiffusionRewardManager(config).run_batch(make_data(frames, ["a", "b"])))
    expected = [float(np.mean([-jpeg_size_ratio(frame, 95) for frame in video])) for video in frames]
    assert [o["reward_score"] for o in out] == pytest.approx(expected)
    assert [o["reward_extra_info"]["reward/jpeg"] for o in out] == pytest.approx(expected)
    assert expected[0] != pytest.approx(expected[1])


def test_a_video_reward_models_score_reaches_the_reward_for_whole_videos(tiny_model):
    """The tiny VideoReward (``videoalign``, a video scorer) gets each whole video, after the entry's frame_stride,
    with the sample's prompt: the reward is its score of that video, not a mean over frames."""
    from verl_omni.utils.reward_score.videoalign import VideoAlignParams, load_videoalign

    params = {"model_path": str(tiny_model("videoalign")), "dtype": "float32", "num_frames": 2, "score": "TA"}
    entry = {"type": "videoalign", "name": "va", "frame_stride": 2, "params": params}
    videos = make_images(8).view(2, 4, 3, 32, 32)
    prompts = ["a red car", "a cat near the tree"]
    data = make_data(videos, [[{"role": "user", "content": prompts[0]}], prompts[1]])
    out = asyncio.run(DiffusionRewardManager(make_config(scorers=[entry])).run_batch(data))
    rewards = load_videoalign(VideoAlignParams(**params)).rewards(videos[:, ::2], prompts, normalize=True)
    expected = [r["TA"] for r in rewards]
    assert [o["reward_extra_info"]["reward/va"] for o in out] == pytest.approx(expected, abs=1e-6)
    assert [o["reward_score"] for o in out] == pytest.approx(expected, abs=1e-6)
    assert expected[0] != pytest.approx(expected[1], abs=1e-4)


def test_audio_reaches_the_score_batch_when_the_rollout_output_has_it():
    manager = DiffusionRewardManager(make_config(scorers=[{"type": "brightness"}]))
    data = make_data(make_images(2), ["a", "b"])
    assert (manager.to_score_batch(data).audio, manager.to_score_batch(data).sample_rate) == (None, None)
    waves = torch.randn(2, 800, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    data.batch["audio"] = waves
    with pytest.raises(KeyError, match="no sample rates under 'audio_sample_rate'"):
        manager.to_score_batch(data)
    data.non_tensor_batch["audio_sample_rate"] = np.array([24_000, 16_000], dtype=object)
    with pytest.raises(ValueError, match="one sample rate for the batch"):
        manager.to_score_batch(data)
    data.non_tensor_batch["audio_sample_rate"] = np.array([24_000, 24_000], dtype=object)
    batch = manager.to_score_batch(data)
    assert batch.sample_rate == 24_000 and [w.dtype for w in batch.audio] == [torch.float32] * 2
    assert torch.equal(torch.stack(batch.audio), waves.float())

"""DiffusionRewardLoopManager on a real local Ray cluster: batch scoring and per-sample async scoring."""

import asyncio
import math

import pytest
import ray
from reward_loop_helpers import make_config, make_data, make_images

from verl_omni.reward_loop import DiffusionRewardLoopManager
from verl_omni.utils.reward_score.jpeg import jpeg_size_ratio

pytestmark = pytest.mark.slow


def scorers(refusing_url):
    ocr = {"url": refusing_url, "model": "vlm", "max_retries": 1, "backoff_s": 0.01, "max_backoff_s": 0.01}
    return [
        {"type": "jpeg_compressibility", "weight": 3.0},
        {"type": "jpeg_incompressibility", "weight": 1.0},
        {"type": "ocr", "required": False, "params": ocr},
    ]


def expected_rewards(images):
    """(3·(−r) + 1·r) / 4 = −r/2 with r the JPEG size ratio; the failing optional ocr is left out."""
    return [-jpeg_size_ratio(image, 95) / 2 for image in images]


@pytest.fixture(scope="module")
def manager(ray_driver):
    """Two workers in async mode; ``compute_rm_score`` (the synchronous path) works in either mode."""
    import socket

    with socket.socket() as sock:  # bound, never listening: the optional ocr is refused throughout
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        yield DiffusionRewardLoopManager(make_config(scorers=scorers(url), num_workers=2, async_reward=True))


def test_worker_handles_are_given_to_the_agent_loop_only_in_async_mode(manager, ray_driver):
    assert manager.reward_loop_worker_handles == manager.reward_loop_workers
    assert len(manager.reward_loop_workers) == 2
    sync = DiffusionRewardLoopManager(make_config(scorers=[{"type": "jpeg_compressibility"}], num_workers=1))
    assert sync.reward_loop_worker_handles is None
    ray_driver.kill(sync.reward_loop_workers[0])


def test_compute_rm_score_over_workers_with_padding(manager):
    images = make_images(5)
    out = manager.compute_rm_score(make_data(images, [f'sign "{i}"' for i in range(5)]))
    assert out.batch["rm_scores"].shape == (5,)
    assert out.batch["rm_scores"].tolist() == pytest.approx(expected_rewards(images), abs=1e-6)
    assert out.batch["rm_scores"][0] > out.batch["rm_scores"][1]  # flat above noise
    assert set(out.meta_info["reward_extra_keys"]) == {
        "reward/jpeg_compressibility",
        "reward/jpeg_incompressibility",
        "reward/ocr",
    }
    assert all(math.isnan(v) for v in out.non_tensor_batch["reward/ocr"])
    metrics = out.meta_info["metrics"]
    assert metrics["reward/ocr/excluded"] == 5.0 and "reward/ocr/mean" not in metrics
    assert metrics["reward/jpeg_compressibility/excluded"] == 0.0
    assert metrics["reward/mean"] == pytest.approx(sum(expected_rewards(images)) / 5)


def test_video_samples_are_scored_per_frame_on_both_paths(manager):
    """Videos ``[B, F, 3, H, W]`` cross the workers (padding, chunks, the per-sample call) and each
    image scorer scores the mean over frames."""
    import torch

    videos = torch.stack([make_images(3, size=16), make_images(3, size=16).flip(0), make_images(3, size=16)])
    videos = torch.cat([videos, videos[:2]])  # 5 samples: padded to the 2 workers
    expected = [sum(expected_rewards(video)) / 3 for video in videos]
    prompts = [f'sign "{i}"' for i in range(5)]
    out = manager.compute_rm_score(make_data(videos, prompts))
    assert out.batch["rm_scores"].tolist() == pytest.approx(expected, abs=1e-6)
    single = ray.get(manager.reward_loop_worker_handles[1].compute_score.remote(make_data(videos[1:2], prompts[1:2])))
    assert single["reward_score"] == pytest.approx(expected[1], abs=1e-6)


# how long the last sample's stand-in generation waits for the first sample's score before the test fails
FIRST_SCORE_WAIT_S = 300


def test_per_sample_scoring_overlaps_a_slow_rollout(manager):
    """Overlap shown by explicit ordering, on a stand-in generator (not the real engine): samples 0-2 finish
    generating at once and are sent to a reward worker each on its own, and the last sample finishes generating only
    once the first sample's score is back. A worker that held the scores until the batch was complete would never
    answer the first sample: the wait fails instead of the rollout finishing."""
    worker = manager.reward_loop_worker_handles[0]
    images = make_images(4)
    samples = [make_data(images[i : i + 1], [f'sign "{i}"']) for i in range(4)]
    events, results = [], {}

    async def run_all():
        first_scored = asyncio.Event()

        async def rollout_and_score(i):
            if i == 3:  # the stand-in for denoising the last sample: still running until sample 0 is scored
                try:
                    await asyncio.wait_for(first_scored.wait(), FIRST_SCORE_WAIT_S)
                except TimeoutError:
                    pytest.fail(f"sample 0 was not scored within {FIRST_SCORE_WAIT_S} s while sample 3 generated")
            events.append(("generated", i))
            results[i] = await worker.compute_score.remote(samples[i])
            events.append(("scored", i))
            if i == 0:
                first_scored.set()

        await asyncio.gather(*(rollout_and_score(i) for i in range(4)))

    asyncio.run(run_all())
    assert events.index(("scored", 0)) < events.index(("generated", 3)), events
    assert [results[i]["reward_score"] for i in range(4)] == pytest.approx(expected_rewards(images), abs=1e-6)
    assert all(isinstance(results[i]["reward_score"], float) for i in range(4))
    assert math.isnan(results[0]["reward_extra_info"]["reward/ocr"])

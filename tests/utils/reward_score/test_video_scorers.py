"""Video samples ``[B, F, 3, H, W]``: image scorers per frame, ``temporal_consistency``, ``http_video``.

Videos are small tensors built here; the HTTP scorers talk to a real local server (tests/utils/conftest.py)
that decodes what it receives (PNG frames, or the mp4 with PyAV) and scores it.
"""

import asyncio
import base64
import io

import av
import numpy as np
import pytest
import torch
from PIL import Image

from verl_omni.utils.reward_score import MultiReward, ScoreBatch, ScorerError, build_params, get_scorer_cls
from verl_omni.utils.reward_score.multi import WeightedScorer
from verl_omni.utils.reward_score.temporal import pixel_consistency


def video_of(values, h=8, w=8) -> torch.Tensor:
    """A uint8 video ``[F, 3, h, w]`` whose frame t is flat at ``values[t]``."""
    return torch.stack([torch.full((3, h, w), v, dtype=torch.uint8) for v in values])


def random_videos(b, f, h=16, w=16, seed=0) -> torch.Tensor:
    return torch.randint(0, 256, (b, f, 3, h, w), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def make(name, **params):
    cls = get_scorer_cls(name)
    return cls(build_params(cls.params_cls, params, "test"))


def run(entries, batch):
    return asyncio.run(MultiReward(entries).score(batch))


# ---- image scorers per frame --------------------------------------------------------------------


@pytest.mark.parametrize("stride,expected", [(1, [0.5, 0.25]), (2, [0.3, 0.0]), (3, [0.4, 0.5])])
def test_an_image_scorer_scores_the_mean_of_the_kept_frames(stride, expected):
    videos = torch.stack([video_of([51, 204, 102, 153]), video_of([0, 0, 0, 255])])
    entry = WeightedScorer("brightness", make("brightness"), 1.0, True, frame_stride=stride)
    result = run([entry], ScoreBatch(videos, ["a", "b"]))
    assert result.rewards == pytest.approx(expected)


def test_a_per_sample_http_scorer_gets_every_kept_frame_with_the_sample_prompt_and_sources(scoring_server):
    """vlm_judge on videos: one request per kept frame, each with its own sample's prompt and sources."""

    def judge(body):
        parts = body["messages"][-1]["content"]
        png = base64.b64decode(parts[-2]["image_url"]["url"].split(",", 1)[1])
        return f"Score: {np.array(Image.open(io.BytesIO(png))).mean() / 25.5:.4f}"

    scoring_server.chat_reply = judge
    judge_scorer = make("vlm_judge", url=scoring_server.url + "/v1", model="m", max_retries=0)
    videos = torch.stack([video_of([51, 0, 153, 0, 255]), video_of([0, 255, 0, 255, 0])])
    source = torch.full((3, 4, 4), 7, dtype=torch.uint8)
    batch = ScoreBatch(videos, ["first", "second"], sources=[[source], []])
    result = run([WeightedScorer("judge", judge_scorer, 1.0, True, frame_stride=2)], batch)
    assert result.rewards == pytest.approx([(0.2 + 0.6 + 1.0) / 3, 0.0])
    texts = sorted(
        r["messages"][-1]["content"][-1]["text"].split("Instruction: ")[1][:6] for r in scoring_server.requests
    )
    assert texts == ["first\n", "first\n", "first\n", "second", "second", "second"]
    with_source = [r for r in scoring_server.requests if len(r["messages"][-1]["content"]) == 3]
    assert len(with_source) == 3


def test_a_nan_on_one_frame_is_an_error_naming_the_scorer():
    class NanOnBright(type(make("brightness"))):
        def score_sync(self, batch):
            return [float("nan") if image.float().mean() > 200 else 0.5 for image in batch.images]

    entry = WeightedScorer("flaky", NanOnBright(), 1.0, False)
    with pytest.raises(ValueError, match="scorer 'flaky' returned a non-finite score nan for sample 3"):
        run([entry], ScoreBatch(torch.stack([video_of([0, 0]), video_of([0, 255])]), ["a", "b"]))


def test_frame_stride_is_validated_with_its_key():
    from verl_omni.workers.config.reward import DiffusionRewardConfig

    with pytest.raises(ValueError, match=r"reward.diffusion.scorers\[0\].frame_stride must be an integer >= 1, got 0"):
        DiffusionRewardConfig(scorers=[{"type": "brightness", "frame_stride": 0}])
    cfg = DiffusionRewardConfig(scorers=[{"type": "brightness", "frame_stride": 4}])
    assert MultiReward.from_configs(cfg.scorers, "k").entries[0].frame_stride == 4


# ---- temporal consistency -----------------------------------------------------------------------


def test_pixel_consistency_follows_its_definition():
    assert pixel_consistency(video_of([9, 9, 9])) == 1.0
    assert pixel_consistency(video_of([0, 255, 0])) == 0.0
    assert pixel_consistency(video_of([0, 51, 153])) == pytest.approx(1 - (51 + 102) / 2 / 255)
    video = random_videos(1, 4)[0]
    diffs = [(video[t + 1].int() - video[t].int()).abs().float().mean() for t in range(3)]
    assert pixel_consistency(video) == pytest.approx(1 - float(sum(diffs) / 3) / 255, rel=1e-6)


def test_temporal_consistency_applies_the_entry_frame_stride():
    videos = torch.stack([video_of([0, 255, 0, 255]), video_of([0, 51, 102, 153])])
    scorer = make("temporal_consistency")
    assert run([WeightedScorer("tc", scorer, 1.0, True)], ScoreBatch(videos, ["", ""])).rewards == pytest.approx(
        [0.0, 0.8]
    )
    assert run([WeightedScorer("tc", scorer, 1.0, True, 2)], ScoreBatch(videos, ["", ""])).rewards == pytest.approx(
        [1.0, 1 - 102 / 255]
    )


def test_video_scorers_refuse_images_and_single_frames():
    scorer = make("temporal_consistency")
    with pytest.raises(ValueError, match=r"scorer 'tc' scores videos \[B, F, 3, H, W\] but the batch holds images"):
        run([WeightedScorer("tc", scorer, 1.0, False)], ScoreBatch(torch.zeros(1, 3, 4, 4, dtype=torch.uint8), [""]))
    with pytest.raises(ValueError, match="at least 2 frames"):
        run([WeightedScorer("tc", scorer, 1.0, False, 4)], ScoreBatch(random_videos(1, 3), [""]))


def test_clip_temporal_consistency_is_one_for_a_still_video_and_lower_for_noise(tiny_clip_dir):
    scorer = make("temporal_consistency", features="clip", model_path=str(tiny_clip_dir), batch_size=2)
    still = random_videos(1, 1, 32, 32, seed=1).expand(1, 3, 3, 32, 32)
    videos = torch.cat([still, random_videos(1, 3, 32, 32, seed=2)])
    scores = asyncio.run(scorer.score(ScoreBatch(videos.contiguous(), ["", ""])))
    assert scores[0] == pytest.approx(1.0, abs=1e-5)
    assert -1.0 <= scores[1] < scores[0] - 1e-4


def test_clip_features_need_a_model_path():
    with pytest.raises(ValueError, match="model_path must name a local CLIP directory when features is 'clip'"):
        make("temporal_consistency", features="clip")


# ---- http_video ---------------------------------------------------------------------------------


def decode_mp4(data: str) -> tuple[np.ndarray, float]:
    with av.open(io.BytesIO(base64.b64decode(data))) as container:
        stream = container.streams.video[0]
        frames = np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(stream)])
        return frames, float(stream.average_rate)


def decode_pngs(frames: list[str]) -> np.ndarray:
    return np.stack([np.array(Image.open(io.BytesIO(base64.b64decode(f)))) for f in frames])


def mean_brightness_service(body):
    """Score = mean pixel / 255 of the decoded video, + 10 × (number of frames)."""
    decoded = [decode_mp4(v)[0] if body["format"] == "mp4" else decode_pngs(v) for v in body["videos"]]
    return {"scores": [float(v.mean()) / 255 + 10 * len(v) for v in decoded]}


@pytest.mark.parametrize("video_format", ["mp4", "frames"])
def test_http_video_sends_each_video_in_chunks_and_reads_one_score_each(scoring_server, video_format):
    scoring_server.scores_from_payload = mean_brightness_service
    videos = torch.stack([video_of([v, v + 20, v + 40], 16, 16) for v in (0, 60, 120, 180, 200)])
    batch = ScoreBatch(videos, list("abcde"), targets=["x", None, None, None, "y"])
    scorer = make("http_video", url=scoring_server.url + "/score", batch_size=2, video_format=video_format, fps=12)
    entry = WeightedScorer("video", scorer, 1.0, True, frame_stride=1)
    scores = run([entry], batch).rewards
    exact = [30 + (v + 20) / 255 for v in (0, 60, 120, 180, 200)]
    # mp4 is lossy (H.264, yuv420p); flat frames come back within a few levels
    assert scores == pytest.approx(exact, abs=0 if video_format == "frames" else 3 / 255)
    chunks = sorted((r["prompts"], r["targets"], r["format"], r["fps"]) for r in scoring_server.requests)
    assert chunks == [
        (["a", "b"], ["x", None], video_format, 12),
        (["c", "d"], [None, None], video_format, 12),
        (["e"], ["y"], video_format, 12),
    ]


def test_http_video_mp4_decodes_to_the_frames_sent(scoring_server):
    received = {}

    def keep(body):
        received["frames"], received["fps"] = decode_mp4(body["videos"][0])
        return {"scores": [0.0]}

    scoring_server.scores_from_payload = keep
    gradient = torch.linspace(0, 255, 32).round().to(torch.uint8)
    frame = torch.stack(
        [gradient.expand(24, 32), gradient.flip(0).expand(24, 32), torch.full((24, 32), 90, dtype=torch.uint8)]
    )
    video = torch.stack([frame.roll(2 * t, dims=2) for t in range(6)])
    asyncio.run(make("http_video", url=scoring_server.url + "/score", fps=5).score(ScoreBatch(video[None], ["p"])))
    assert received["frames"].shape == (6, 24, 32, 3) and received["fps"] == 5.0
    error = np.abs(received["frames"].astype(int) - video.permute(0, 2, 3, 1).numpy().astype(int))
    assert error.mean() < 4


def test_http_video_follows_the_http_retry_and_error_rules(scoring_server, closed_port_url):
    batch = ScoreBatch(random_videos(2, 2), ["a", "b"])
    scoring_server.scores_from_payload = lambda body: {"scores": [1.0]}
    with pytest.raises(ScorerError, match=r"scorer 'http_video': .* must answer \{\"scores\": \[2 numbers\]\}"):
        asyncio.run(make("http_video", url=scoring_server.url + "/score", max_retries=2).score(batch))
    assert len(scoring_server.requests) == 1
    down = make("http_video", url=closed_port_url, max_retries=1, backoff_s=0.01, max_backoff_s=0.01)
    with pytest.raises(ScorerError, match="required scorer 'video' failed: .*after 2 attempts"):
        run([WeightedScorer("video", down, 1.0, True)], batch)


def test_http_video_refuses_an_odd_frame_size_for_mp4():
    scorer = make("http_video", url="http://127.0.0.1:1/score")
    with pytest.raises(ValueError, match="even frame size, got 15x16"):
        asyncio.run(scorer.score(ScoreBatch(random_videos(1, 2, 15, 16), ["p"])))

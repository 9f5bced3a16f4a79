"""Video samples for every scorer: frame subsampling, and image scorers applied per frame.

A video batch holds uint8 ``[B, F, 3, H, W]``. The combiner scores it through :func:`score_any`:

* the frames ``0, s, 2s, ...`` are kept (``s`` = the scorer entry's ``frame_stride``);
* a video scorer (``Scorer.video_input``) gets those videos;
* an audio scorer (``Scorer.audio_input``) gets the batch as it is (it reads ``audio``, not frames);
* an image scorer gets every kept frame as an image (prompt, target and source images repeated),
  and a sample's score is the mean over its kept frames.

So any image scorer works on videos with no code of its own; a frame that fails fails its sample.
"""

from __future__ import annotations

import dataclasses
import logging

from verl_omni.utils.reward_score.base import ScoreBatch, Scorer, check_scores

logger = logging.getLogger(__name__)


def every_nth_frame(batch: ScoreBatch, stride: int) -> ScoreBatch:
    """The video batch keeping frames ``0, stride, 2*stride, ...`` of each sample."""
    if stride < 1:
        raise ValueError(f"frame_stride must be >= 1, got {stride}")
    if stride == 1:
        return batch
    return dataclasses.replace(batch, images=batch.images[:, ::stride])


def frames_as_images(batch: ScoreBatch) -> ScoreBatch:
    """The ``B * F`` frames of a video batch as an image batch, sample-major (sample 0's frames first)."""
    size, frames = batch.images.shape[:2]

    def repeat(values):
        return None if values is None else [v for v in values for _ in range(frames)]

    images = batch.images.reshape(size * frames, *batch.images.shape[2:])
    return ScoreBatch(
        images,
        repeat(batch.prompts),
        repeat(batch.targets),
        repeat(batch.sources),
        repeat(batch.audio),
        batch.sample_rate,
    )


async def score_any(scorer: Scorer, batch: ScoreBatch, name: str, frame_stride: int = 1) -> list[float]:
    """Scores of ``batch`` (images or videos) by ``scorer``, registered or labelled ``name``.

    Images go to an image scorer as they are; a video scorer refuses them (ValueError). Videos are
    subsampled by ``frame_stride``; an image scorer's per-frame scores are averaged per sample.
    The per-frame scores are checked (finite, one per frame) before averaging. An audio scorer gets the
    batch unchanged, and refuses (ValueError) one without audio.
    """
    if scorer.audio_input:
        if batch.audio is None:
            raise ValueError(
                f"scorer {name!r} scores audio but the batch has none: use it on a model that makes sound "
                "(the rollout output's audio under reward.diffusion.audio_key), or remove it"
            )
        return await scorer.score(batch)
    if not batch.is_video:
        if scorer.video_input:
            raise ValueError(
                f"scorer {name!r} scores videos [B, F, 3, H, W] but the batch holds images "
                f"{tuple(batch.images.shape)}: use it on a video model's samples, or remove it"
            )
        return await scorer.score(batch)
    batch = every_nth_frame(batch, frame_stride)
    if scorer.video_input:
        return await scorer.score(batch)
    size, frames = batch.images.shape[:2]
    per_frame = check_scores(await scorer.score(frames_as_images(batch)), size * frames, name)
    return [sum(per_frame[i * frames : (i + 1) * frames]) / frames for i in range(size)]

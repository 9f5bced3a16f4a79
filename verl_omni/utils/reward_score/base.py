"""What every reward scorer shares: the input batch contract, the error type, the base class.

Contract: a scorer receives a :class:`ScoreBatch` (uint8 images ``[B, 3, H, W]`` or videos
``[B, F, 3, H, W]``, ``B`` prompts, optional per-sample target text and source images) and returns
``B`` finite floats. An image scorer only ever sees images: on a video batch the combiner scores its
frames and averages them (``video.py``); a scorer that declares ``video_input`` gets whole videos. A batch
may also carry each sample's audio (float32 waveform ``[samples]`` at one ``sample_rate``), which a scorer
that declares ``audio_input`` scores. An operational failure (a server
that stays down, a timeout after the retries) is raised as :class:`ScorerError`, which the
multi-reward combiner applies its required/optional policy to; any other exception is a bug and
propagates.
"""

from __future__ import annotations

import asyncio
import logging
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from verl.base_config import BaseConfig

from verl_omni.utils.reward_score.environment import ScorerEnvironment

logger = logging.getLogger(__name__)


class ScorerError(RuntimeError):
    """A scorer could not produce scores (after its own retries); carries the cause as ``__cause__``."""


@dataclass
class ScoreBatch:
    """Images (or videos) to score with their prompts, optional target texts and source images.

    Args:
        images (torch.Tensor): uint8, values 0..255, on CPU: images ``[B, 3, H, W]`` or videos
            ``[B, F, 3, H, W]`` (``F`` frames each).
        prompts (list[str]): ``B`` generation prompts (the editing instruction for an edit).
        targets (list[str | None] | None): optional ground-truth text per sample (e.g. the OCR target).
        sources (list[list[torch.Tensor]] | None): optional source images per sample (the images an
            edit started from), each uint8 ``[3, h, w]`` of any size; an empty list for a sample
            without one (text-to-image).
        audio (list[torch.Tensor] | None): optional mono waveform per sample, float32 ``[samples]`` in
            [-1, 1] (lengths may differ), for a model that makes sound with its images or videos.
        sample_rate (int | None): samples per second of every ``audio`` waveform; set exactly when ``audio`` is.
    """

    images: torch.Tensor
    prompts: list[str]
    targets: list[str | None] | None = None
    sources: list[list[torch.Tensor]] | None = None
    audio: list[torch.Tensor] | None = None
    sample_rate: int | None = None

    def __post_init__(self):
        images = self.images
        if not isinstance(images, torch.Tensor):
            raise TypeError(f"images must be a torch.Tensor of uint8 [B, 3, H, W], got {type(images).__name__}")
        if images.dtype != torch.uint8:
            raise ValueError(f"images must be uint8 [B, 3, H, W] in 0..255, got dtype {images.dtype}")
        if images.ndim not in (4, 5) or images.shape[-3] != 3 or 0 in images.shape[1:]:
            raise ValueError(
                f"images must have shape [B, 3, H, W] (images) or [B, F, 3, H, W] (videos), got {tuple(images.shape)}"
            )
        size = images.shape[0]
        if len(self.prompts) != size or not all(isinstance(p, str) for p in self.prompts):
            raise ValueError(f"prompts must be {size} strings (one per image), got {self.prompts!r}")
        if self.targets is not None and len(self.targets) != size:
            raise ValueError(f"targets must have one entry per image ({size}), got {len(self.targets)}")
        if self.sources is not None:
            self._check_sources(size)
        self._check_audio(size)

    def _check_sources(self, size: int) -> None:
        if len(self.sources) != size:
            raise ValueError(f"sources must have one list per image ({size}), got {len(self.sources)}")
        for i, images in enumerate(self.sources):
            for j, image in enumerate(images):
                if not (isinstance(image, torch.Tensor) and image.dtype == torch.uint8 and image.ndim == 3):
                    raise ValueError(f"sources[{i}][{j}] must be a uint8 tensor [3, h, w], got {image!r:.100}")
                if image.shape[0] != 3 or 0 in image.shape:
                    raise ValueError(f"sources[{i}][{j}] must have shape [3, h, w], got {tuple(image.shape)}")

    def _check_audio(self, size: int) -> None:
        if self.audio is None:
            if self.sample_rate is not None:
                raise ValueError(f"sample_rate={self.sample_rate} is set but the batch has no audio")
            return
        if isinstance(self.sample_rate, bool) or not isinstance(self.sample_rate, int) or self.sample_rate < 1:
            raise ValueError(
                f"sample_rate must be a positive integer (Hz) when audio is given, got {self.sample_rate!r}"
            )
        if len(self.audio) != size:
            raise ValueError(f"audio must have one waveform per image ({size}), got {len(self.audio)}")
        for i, wave in enumerate(self.audio):
            if not (isinstance(wave, torch.Tensor) and wave.dtype == torch.float32 and wave.ndim == 1 and wave.numel()):
                raise ValueError(f"audio[{i}] must be a non-empty float32 waveform [samples], got {wave!r:.100}")

    def __len__(self) -> int:
        return self.images.shape[0]

    @property
    def is_video(self) -> bool:
        """True when ``images`` holds videos ``[B, F, 3, H, W]``."""
        return self.images.ndim == 5

    def select(self, index: int) -> ScoreBatch:
        """The one-sample batch at ``index`` (for scorers that work per sample)."""
        targets = None if self.targets is None else [self.targets[index]]
        sources = None if self.sources is None else [self.sources[index]]
        audio = None if self.audio is None else [self.audio[index]]
        return ScoreBatch(
            self.images[index : index + 1], [self.prompts[index]], targets, sources, audio, self.sample_rate
        )


@dataclass
class NoParams(BaseConfig):
    """A scorer without parameters."""


class Scorer(ABC):
    """Base class of reward scorers; subclasses register with ``@register_scorer(name)``.

    Class attributes:
        params_cls: dataclass of the scorer's ``params`` (validated in its ``__post_init__``).
        per_sample: the combiner calls the scorer once per sample, so that a failure excludes only
            that sample (request-per-image scorers such as ``ocr``).
        video_input: the scorer scores whole videos ``[B, F, 3, H, W]`` (and refuses images); an
            image scorer (False) is given the frames of a video batch and their mean is its score.
        audio_input: the scorer scores the batch's ``audio`` (and refuses a batch without it); it is given
            the batch as it is, videos unsplit.
        extra: the ``verl_omni`` pip extra whose packages the scorer imports (``pip install
            'verl_omni[<extra>]'``); None when the trainer's own packages suffice. The scorer table
            (``docs/reference/scorers.md``) lists it.
        requirements: pip requirement strings of the scorer's own environment; non-empty only for an
            :class:`~verl_omni.utils.reward_score.own_env.OwnEnvironmentScorer`, which runs in a separate
            virtual environment built from them (the trainer's preflight builds it before Ray).
        inherit: the own environment imports what its requirements do not install from the trainer's
            packages (torch, too heavy to install twice), searched after its own (``environment.py``).
        overrides: ``uv`` override requirements of the own environment, e.g. to leave out a dependency the
            requirements declare but the scorer never imports (``environment.ScorerEnvironment``); none by default.
    """

    params_cls: ClassVar[type[BaseConfig]] = NoParams
    per_sample: ClassVar[bool] = False
    video_input: ClassVar[bool] = False
    audio_input: ClassVar[bool] = False
    extra: ClassVar[str | None] = None
    requirements: ClassVar[tuple[str, ...]] = ()
    inherit: ClassVar[bool] = False
    overrides: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def environment(cls) -> ScorerEnvironment | None:
        """The scorer's own environment (built from ``requirements``), None when it runs in the trainer's."""
        if not cls.requirements:
            return None
        return ScorerEnvironment(tuple(cls.requirements), inherit=cls.inherit, overrides=tuple(cls.overrides))

    def __init__(self, params: BaseConfig | None = None):
        self.params = params if params is not None else self.params_cls()

    @classmethod
    def device_of(cls, params: BaseConfig) -> str:
        """The torch device the scorer computes on with ``params``: its ``device`` parameter for the
        model-based scorers, ``"cpu"`` for the others (model-free, or the model is behind HTTP).

        The reward config reads it to check that a scorer asking for a GPU runs in reward workers
        that have one (``reward.diffusion.num_gpus_per_worker``, docs/guide/rewards.md, "Devices").
        """
        return str(getattr(params, "device", "cpu"))

    @abstractmethod
    async def score(self, batch: ScoreBatch) -> list[float]:
        """Return one finite float per sample of ``batch``; raise :class:`ScorerError` on failure."""


class ThreadedScorer(Scorer):
    """A CPU/GPU-bound scorer: ``score_sync`` runs in a thread so the event loop keeps serving."""

    async def score(self, batch: ScoreBatch) -> list[float]:
        return await asyncio.to_thread(self.score_sync, batch)

    @abstractmethod
    def score_sync(self, batch: ScoreBatch) -> list[float]:
        """Blocking scoring of ``batch``."""


def build_params(params_cls: type[BaseConfig], params: dict[str, Any] | None, key: str) -> BaseConfig:
    """Build ``params_cls(**params)``; errors name the dotted config ``key`` of the bad entry."""
    params = dict(params or {})
    names = set(params_cls.__dataclass_fields__) - {"_target_"}
    unknown = sorted(set(params) - names)
    if unknown:
        # a parameter another scorer now takes: say which (``moved_parameters`` on the params class)
        moved = getattr(params_cls, "moved_parameters", {})
        hints = "".join(f"; {name}: {moved[name]}" for name in unknown if name in moved)
        raise ValueError(f"{key}: unknown parameter(s) {unknown}; {params_cls.__name__} accepts {sorted(names)}{hints}")
    try:
        return params_cls(**params)
    except ValueError as e:
        raise ValueError(f"{key}.{e}") from e


def check_scores(scores: list[float], batch_size: int, scorer: str) -> list[float]:
    """Check that a scorer returned ``batch_size`` finite numbers; errors name the scorer and sample."""
    if len(scores) != batch_size:
        raise ValueError(f"scorer {scorer!r} returned {len(scores)} scores for {batch_size} images")
    out = []
    for i, value in enumerate(scores):
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"scorer {scorer!r} returned a non-finite score {value} for sample {i}")
        out.append(value)
    return out

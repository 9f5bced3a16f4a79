"""Config of the diffusion reward loop: the YAML node ``reward.diffusion``.

It sits beside verl's own ``reward`` keys (``reward.reward_manager.name`` must be ``diffusion``).
Every error names the full dotted key, e.g. ``reward.diffusion.scorers[1].params.timeout_s``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from verl.base_config import BaseConfig

logger = logging.getLogger(__name__)

CONFIG_KEY = "reward.diffusion"
RESOURCE_POOLS = ("own", "actor")


@dataclass
class ScorerConfig(BaseConfig):
    """One term of the multi-reward.

    Args:
        type (str): registered scorer name, e.g. ``ocr``, ``pickscore``, ``jpeg_compressibility``.
        name (str | None): label used in metrics and extra info; defaults to ``type``. Unique.
        weight (float): weight in the per-sample weighted mean, > 0. Default 1.0.
        required (bool): if True a failure of this scorer raises; if False it is logged and the
            scorer is left out of the weighted mean of the affected samples. Default True.
        params (dict): scorer parameters, checked by the scorer's own params dataclass.
        frame_stride (int): on video samples ``[F, 3, H, W]``, score frames ``0, s, 2s, ...`` only;
            an image scorer's score is the mean over those frames (docs/guide/rewards.md, "Videos"). Default 1.
    """

    type: str = ""
    name: str | None = None
    weight: float = 1.0
    required: bool = True
    params: dict = field(default_factory=dict)
    frame_stride: int = 1

    @property
    def label(self) -> str:
        return self.name or self.type

    def validate(self, key: str) -> str:
        """Check this entry, found at dotted config ``key``, against the scorer registry; return the
        torch device the scorer declares (:meth:`Scorer.device_of`)."""
        from verl_omni.utils.reward_score import build_params, get_scorer_cls

        if not isinstance(self.weight, int | float) or not math.isfinite(self.weight) or self.weight <= 0:
            raise ValueError(f"{key}.weight must be a finite number > 0, got {self.weight!r}")
        if isinstance(self.frame_stride, bool) or not isinstance(self.frame_stride, int) or self.frame_stride < 1:
            raise ValueError(f"{key}.frame_stride must be an integer >= 1, got {self.frame_stride!r}")
        if self.label == "mean":
            raise ValueError(f"{key}.name 'mean' is reserved for the combined reward metric")
        try:
            scorer_cls = get_scorer_cls(self.type)
        except ValueError as e:
            raise ValueError(f"{key}.type: {e}") from None
        params = build_params(scorer_cls.params_cls, self.params, f"{key}.params")
        return scorer_cls.device_of(params)


def scorer_config_from(entry: Any, key: str) -> ScorerConfig:
    """A :class:`ScorerConfig` from a YAML mapping found at dotted config ``key`` (unknown keys are errors)."""
    if isinstance(entry, ScorerConfig):
        return entry
    if not isinstance(entry, Mapping):
        raise ValueError(f"{key} must be a mapping with type/name/weight/required/params, got {entry!r}")
    entry = {k: v for k, v in entry.items() if k != "_target_"}
    allowed = {f.name for f in fields(ScorerConfig)} - {"_target_"}
    unknown = sorted(set(entry) - allowed)
    if unknown:
        raise ValueError(f"{key}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")
    return ScorerConfig(**entry)


@dataclass
class DiffusionRewardConfig(BaseConfig):
    """Reward loop for generated images (``reward.diffusion``).

    Args:
        scorers (list[ScorerConfig]): the weighted scorers, at least one. Default: the toy ``brightness`` reward
            the built-in tiny run learns; real runs set theirs (e.g. ``ocr``).
        preflight (bool): before Ray starts, check that every scorer's ``params.url`` answers
            (``verl_omni/trainer/config/preflight.py``); False skips it (a service started later). Default True.
        num_workers (int): reward loop workers (Ray actors). Default 1.
        async_reward (bool): score each sample as soon as the rollout finishes it (the agent loop
            calls the workers), overlapping rollout; False scores the batch after rollout. Default False.
        num_cpus_per_worker (float): Ray CPUs reserved per worker. Default 1.
        num_gpus_per_worker (float): GPUs per worker for model-based scorers (a fraction shares one),
            0 for none; required > 0 when a scorer's ``params.device`` is a GPU. Default 0.
        resource_pool (str): where those GPUs come from: ``own`` (GPUs of their own, outside the
            actor's placement groups) or ``actor`` (a share of the actor's GPUs: the workers are placed
            round-robin on the actor's bundles). Default ``own``. Layouts: docs/guide/rewards.md, "Devices".
        image_key (str): ``DataProto.batch`` key of the uint8 images ``[B, 3, H, W]`` or videos
            ``[B, F, 3, H, W]``. Default ``responses``.
        prompt_key (str): ``non_tensor_batch`` key of the prompt (text or chat messages). Default ``raw_prompt``.
        ground_truth_key (str): ``non_tensor_batch`` key of the optional target text (a string or a
            dict with ``ground_truth``). Default ``reward_model``.
        source_images_key (str | None): ``non_tensor_batch`` key of each sample's source images (an
            edit's inputs: a list of images, or verl's ``multi_modal_data`` dict); None reads them from
            the image parts of the prompt's last user turn, where verl's dataset puts them. Default None.
        audio_key (str): ``DataProto.batch`` key of each sample's float32 waveform ``[B, samples]`` or
            ``[B, channels, samples]`` (averaged to mono for the scorers), read only when the rollout output has it (a model that makes sound, for an audio scorer such as ``clap``); its
            sample rate in Hz is ``non_tensor_batch["<audio_key>_sample_rate"]``, one per sample. Default ``audio``.
    """

    scorers: list = field(default_factory=lambda: [ScorerConfig(type="brightness", weight=1.0)])
    preflight: bool = True
    num_workers: int = 1
    async_reward: bool = False
    num_cpus_per_worker: float = 1.0
    num_gpus_per_worker: float = 0.0
    resource_pool: str = "own"
    image_key: str = "responses"
    prompt_key: str = "raw_prompt"
    ground_truth_key: str = "reward_model"
    source_images_key: str | None = None
    audio_key: str = "audio"

    def __post_init__(self):
        if not self.scorers:
            raise ValueError(f"{CONFIG_KEY}.scorers must list at least one scorer")
        scorers = [self._as_scorer_config(s, i) for i, s in enumerate(self.scorers)]
        object.__setattr__(self, "scorers", scorers)
        seen: set[str] = set()
        devices = {}
        for i, scorer in enumerate(scorers):
            devices[i] = scorer.validate(f"{CONFIG_KEY}.scorers[{i}]")
            if scorer.label in seen:
                raise ValueError(f"{CONFIG_KEY}.scorers[{i}].name {scorer.label!r} is used twice; names must be unique")
            seen.add(scorer.label)
        if not isinstance(self.num_workers, int) or self.num_workers < 1:
            raise ValueError(f"{CONFIG_KEY}.num_workers must be an integer >= 1, got {self.num_workers!r}")
        for name in ("num_cpus_per_worker", "num_gpus_per_worker"):
            if getattr(self, name) < 0:
                raise ValueError(f"{CONFIG_KEY}.{name} must be >= 0, got {getattr(self, name)!r}")
        if self.resource_pool not in RESOURCE_POOLS:
            raise ValueError(f"{CONFIG_KEY}.resource_pool must be one of {RESOURCE_POOLS}, got {self.resource_pool!r}")
        self._check_devices(devices)

    def _check_devices(self, devices: dict[int, str]) -> None:
        """A scorer declaring a GPU device needs reward workers with a GPU (and the reverse is a waste)."""
        on_gpu = [i for i, device in devices.items() if not device.startswith("cpu")]
        if on_gpu and self.num_gpus_per_worker == 0:
            i = on_gpu[0]
            raise ValueError(
                f"{CONFIG_KEY}.scorers[{i}].params.device={devices[i]!r} needs a GPU in the reward workers, but "
                f"{CONFIG_KEY}.num_gpus_per_worker is 0: set it > 0 (GPUs of their own with resource_pool=own, "
                "a share of the actor's with resource_pool=actor) or run the scorer on 'cpu'"
            )
        if self.num_gpus_per_worker > 0 and not on_gpu:
            logger.warning(
                "%s.num_gpus_per_worker=%s but no scorer runs on a GPU (every params.device is cpu): the GPUs idle",
                CONFIG_KEY,
                self.num_gpus_per_worker,
            )

    @property
    def gpus_of_own(self) -> float:
        """GPUs the reward workers reserve outside the actor's placement groups (0 when sharing them)."""
        return self.num_workers * self.num_gpus_per_worker if self.resource_pool == "own" else 0.0

    @staticmethod
    def _as_scorer_config(entry: Any, index: int) -> ScorerConfig:
        return scorer_config_from(entry, f"{CONFIG_KEY}.scorers[{index}]")

    @classmethod
    def from_config(cls, node: Any) -> DiffusionRewardConfig:
        """Build from the ``reward.diffusion`` node (DictConfig, dict or an instance)."""
        if isinstance(node, cls):
            return node
        if node is None:
            raise ValueError(f"{CONFIG_KEY} is missing: configure the reward scorers there")
        from omegaconf import DictConfig, OmegaConf

        data = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
        data.pop("_target_", None)
        allowed = {f.name for f in fields(cls)} - {"_target_"}
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise ValueError(f"{CONFIG_KEY}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")
        return cls(**data)

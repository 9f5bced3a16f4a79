"""What one rollout request asks of a log-prob pipeline, parsed and checked before any model work.

Shared by every model's rollout pipeline. A request's prompt is a dict with ``prompt_token_ids``
(the model's prompt template already applied, see each model's ``prompt_token_ids`` helper) and
optional ``negative_prompt_token_ids`` (CFG); its sampling settings are one
:class:`~verl_omni.pipelines.sampling.SamplingSpec` (``extra_args['sampling_spec']``, put there by
the engine's ``build_sampling_params``). Every sample gets its own seed: it seeds the sample's SDE
window and its noise generator, so a sample is reproducible whatever else shares its transformer
batch.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from typing import Any

import torch

from verl_omni.pipelines.sampling import SamplingSpec
from verl_omni.pipelines.schedulers.flow_match_sde import sample_sde_window_start
from verl_omni.pipelines.schedulers.mix_ode import progressive_window_start

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RolloutRequest:
    """One engine request, resolved per sample.

    Args:
        prompt_token_ids (`list[int]`): templated prompt ids.
        negative_prompt_token_ids (`list[int]` or None): templated negative prompt ids; None means no negative prompt.
        spec (`SamplingSpec`): the request's sampling settings, ``seeds`` holding one seed per sample.
        window_starts (`list[int]`, length N): first SDE step of each sample, in ``spec.window_range`` (seeded per
            sample, or the progressive schedule's start at ``spec.global_step``).
    """

    prompt_token_ids: list[int]
    negative_prompt_token_ids: list[int] | None
    spec: SamplingSpec
    window_starts: list[int]

    @classmethod
    def build(cls, prompt_token_ids: list[int], negative_prompt_token_ids: list[int] | None, spec: SamplingSpec):
        """The request of ``spec.seeds`` samples, each window placed by its seed or by the progressive schedule."""
        if not spec.seeds:
            raise ValueError("a rollout request needs one seed per sample (SamplingSpec.seeds is empty)")
        if spec.sde_window_schedule == "progressive":
            start = progressive_window_start(
                spec.global_step,
                spec.sde_window_size,
                spec.window_range,
                spec.sde_window_stride,
                spec.sde_window_shift_every,
            )
            starts = [start] * len(spec.seeds)
        else:
            starts = [
                sample_sde_window_start(seed, spec.num_inference_steps, spec.sde_window_size, spec.window_range)
                for seed in spec.seeds
            ]
        return cls(list(prompt_token_ids), negative_prompt_token_ids, spec, starts)

    @property
    def seeds(self) -> tuple[int, ...]:
        return self.spec.seeds

    @property
    def num_samples(self) -> int:
        return len(self.spec.seeds)

    @property
    def window_size(self) -> int:
        return self.spec.sde_window_size

    @property
    def noise_level(self) -> float:
        return self.spec.noise_level

    @property
    def sde_type(self) -> str:
        return self.spec.sde_type

    @property
    def shares_initial_noise_seeds(self) -> bool:
        """Whether the initial noise has seeds of its own (``initial_noise_seeds``) rather than the samples'."""
        return bool(self.spec.initial_noise_seeds)

    def generators(self, device: torch.device) -> list[torch.Generator]:
        """A fresh generator per sample, seeded with the sample's seed."""
        return [torch.Generator(device=device).manual_seed(seed) for seed in self.seeds]

    def initial_noise_generators(self, device: torch.device) -> list[torch.Generator]:
        """A fresh generator per sample for its initial noise, seeded with its ``initial_noise_seeds`` entry."""
        return [torch.Generator(device=device).manual_seed(seed) for seed in self.spec.initial_noise_seeds]

    def sample(self, index: int) -> RolloutRequest:
        """The request of sample ``index`` alone (a pipeline that denoises one sample at a time)."""
        noise_seeds = self.spec.initial_noise_seeds
        spec = replace(
            self.spec,
            seeds=(self.seeds[index],),
            initial_noise_seeds=noise_seeds[index : index + 1] if noise_seeds else (),
        )
        return replace(self, spec=spec, window_starts=[self.window_starts[index]])


def _token_ids(value: Any, name: str, allow_empty: bool = False) -> list[int]:
    ok = isinstance(value, (list, tuple)) and (value or allow_empty) and all(isinstance(t, int) for t in value)
    if not ok:
        raise ValueError(f"prompt[{name!r}] must be a non-empty list of int token ids, got {type(value).__name__}")
    return list(value)


def parse_rollout_request(prompt: Any, sampling_params: Any) -> RolloutRequest:
    """Check one request's prompt and sampling spec and resolve its per-sample seeds and windows."""
    if not isinstance(prompt, dict) or "prompt_token_ids" not in prompt:
        raise ValueError(
            "the rollout pipeline takes token ids: prompt must be a dict with 'prompt_token_ids' "
            f"(and optionally 'negative_prompt_token_ids'), got {type(prompt).__name__}"
        )
    prompt_ids = _token_ids(prompt["prompt_token_ids"], "prompt_token_ids")
    negative = prompt.get("negative_prompt_token_ids")
    negative_ids = None if negative is None else _token_ids(negative, "negative_prompt_token_ids", allow_empty=True)

    spec = SamplingSpec.from_sampling_params(sampling_params)
    num_samples = max(int(sampling_params.num_outputs_per_prompt or 1), 1)
    seeds = spec.seeds
    if not seeds:
        if sampling_params.seed is None:
            raise ValueError("sampling_params.seed (or the spec's seeds) is required: rollouts are seeded")
        seeds = tuple(int(sampling_params.seed) + i for i in range(num_samples))
    if len(seeds) != num_samples:
        raise ValueError(f"the sampling spec has {len(seeds)} seeds for num_outputs_per_prompt={num_samples}")
    return RolloutRequest.build(prompt_ids, negative_ids, replace(spec, seeds=seeds))


def source_images(prompt: Any, request_id: str, max_images: int) -> list:
    """The 1 to ``max_images`` source images of an editing model's request, as RGB PIL images: vLLM-Omni's
    multimodal input ``prompt["multi_modal_data"]["image"]`` (one image, or a list; PIL images or paths)."""
    import PIL.Image

    data = prompt.get("multi_modal_data") if isinstance(prompt, dict) else None
    images = (data or {}).get("image")
    images = [] if images is None else list(images) if isinstance(images, (list, tuple)) else [images]
    if not 1 <= len(images) <= max_images:
        raise ValueError(
            f"request {request_id} has {len(images)} source images in multi_modal_data['image']; the model edits "
            f"1 to {max_images}"
        )
    out = []
    for image in images:
        if isinstance(image, str):
            image = PIL.Image.open(image)
        if not isinstance(image, PIL.Image.Image):
            raise TypeError(f"request {request_id}: a source image must be a PIL image or a path, got {type(image)}")
        out.append(image.convert("RGB"))
    return out


def condition_size(width: int, height: int, area: float, multiple: int) -> tuple[int, int]:
    """``(width, height)`` of a source image as conditioned on: ``area`` pixels at its aspect ratio, sides
    rounded to ``multiple`` (at least one multiple)."""
    ratio = width / height
    w = math.sqrt(area * ratio)
    return max(multiple, round(w / multiple) * multiple), max(multiple, round(w / ratio / multiple) * multiple)

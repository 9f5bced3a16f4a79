"""What one rollout request asks of a log-prob pipeline, parsed and checked before any model work.

Shared by every model's rollout pipeline. A request's prompt is a dict with ``prompt_token_ids``
(the model's prompt template already applied, see each model's ``prompt_token_ids`` helper),
optional ``negative_prompt_token_ids`` (CFG), and in ``sampling_params.extra_args`` the
Flow-GRPO knobs below. Every sample gets its own seed: it
seeds the sample's SDE window and its noise generator, so a sample is reproducible whatever
else shares its transformer batch.

``extra_args`` keys (all optional):
    sde_type (`str`, ``"sde"``): ``"sde"`` or ``"cps"``.
    noise_level (`float`, 0.7): a > 0 inside the SDE window; 0 samples the deterministic ODE and
        records no transition (validation).
    sde_window_size (`int`, 2): W, the number of stochastic, recorded steps.
    sde_window_range (`[int, int]`, ``[0, num_steps]``): steps the window may cover.
    seeds (`list[int]`, ``[seed + i for i < N]``): one seed per output sample.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

import torch

from verl_omni.pipelines.schedulers.flow_match_sde import SDE_TYPES, sample_sde_window_start

logger = logging.getLogger(__name__)

DEFAULT_NOISE_LEVEL = 0.7
DEFAULT_WINDOW_SIZE = 2


@dataclass(frozen=True)
class RolloutRequest:
    """One engine request, resolved per sample.

    Args:
        prompt_token_ids (`list[int]`): templated prompt ids.
        negative_prompt_token_ids (`list[int]` or None): templated negative prompt ids; None means no negative prompt.
        seeds (`list[int]`, length N): one seed per output sample.
        window_starts (`list[int]`, length N): first SDE step of each sample.
        window_size (`int`): W.
        noise_level (`float`): a inside the window.
        sde_type (`str`): ``"sde"`` or ``"cps"``.
    """

    prompt_token_ids: list[int]
    negative_prompt_token_ids: list[int] | None
    seeds: list[int]
    window_starts: list[int]
    window_size: int
    noise_level: float
    sde_type: str

    @property
    def num_samples(self) -> int:
        return len(self.seeds)

    def generators(self, device: torch.device) -> list[torch.Generator]:
        """A fresh generator per sample, seeded with the sample's seed."""
        return [torch.Generator(device=device).manual_seed(seed) for seed in self.seeds]

    def sample(self, index: int) -> RolloutRequest:
        """The request of sample ``index`` alone (a pipeline that denoises one sample at a time)."""
        return replace(self, seeds=[self.seeds[index]], window_starts=[self.window_starts[index]])

    def noise_levels_at(self, step: int) -> list[float]:
        """Each sample's noise level at ``step``: ``noise_level`` inside its window, else 0 (ODE)."""
        return [self.noise_level if start <= step < start + self.window_size else 0.0 for start in self.window_starts]


def _token_ids(value: Any, name: str, allow_empty: bool = False) -> list[int]:
    ok = isinstance(value, (list, tuple)) and (value or allow_empty) and all(isinstance(t, int) for t in value)
    if not ok:
        raise ValueError(f"prompt[{name!r}] must be a non-empty list of int token ids, got {type(value).__name__}")
    return list(value)


def parse_rollout_request(prompt: Any, sampling_params: Any, num_steps: int) -> RolloutRequest:
    """Check one request's prompt and ``extra_args`` and resolve its per-sample seeds and windows."""
    if not isinstance(prompt, dict) or "prompt_token_ids" not in prompt:
        raise ValueError(
            "the rollout pipeline takes token ids: prompt must be a dict with 'prompt_token_ids' "
            f"(and optionally 'negative_prompt_token_ids'), got {type(prompt).__name__}"
        )
    prompt_ids = _token_ids(prompt["prompt_token_ids"], "prompt_token_ids")
    negative = prompt.get("negative_prompt_token_ids")
    negative_ids = None if negative is None else _token_ids(negative, "negative_prompt_token_ids", allow_empty=True)

    extra = dict(sampling_params.extra_args or {})
    num_samples = max(int(sampling_params.num_outputs_per_prompt or 1), 1)
    seeds = extra.get("seeds")
    if seeds is None:
        if sampling_params.seed is None:
            raise ValueError("sampling_params.seed (or extra_args['seeds']) is required: rollouts are seeded")
        seeds = [int(sampling_params.seed) + i for i in range(num_samples)]
    if len(seeds) != num_samples:
        raise ValueError(f"extra_args['seeds'] has {len(seeds)} seeds for num_outputs_per_prompt={num_samples}")

    sde_type = extra.get("sde_type", "sde")
    if sde_type not in SDE_TYPES:
        raise ValueError(f"extra_args['sde_type'] must be one of {SDE_TYPES}, got {sde_type!r}")
    noise_level = float(extra.get("noise_level", DEFAULT_NOISE_LEVEL))
    if not noise_level >= 0:
        raise ValueError(f"extra_args['noise_level'] must be >= 0 (0 = ODE, nothing recorded), got {noise_level}")
    window_size = int(extra.get("sde_window_size", DEFAULT_WINDOW_SIZE))
    window_range = tuple(extra.get("sde_window_range") or (0, num_steps))
    starts = [sample_sde_window_start(seed, num_steps, window_size, window_range) for seed in seeds]
    return RolloutRequest(
        prompt_token_ids=prompt_ids,
        negative_prompt_token_ids=negative_ids,
        seeds=[int(s) for s in seeds],
        window_starts=starts,
        window_size=window_size,
        noise_level=noise_level,
        sde_type=sde_type,
    )

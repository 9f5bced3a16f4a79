"""Replay of recorded rollout transitions: the trainer's side of the Flow-GRPO log-probability.

The rollout records, per sample, the W+1 latents and W timesteps of its SDE window plus the
prompt embeddings; the rollout's :class:`~verl_omni.pipelines.sampling.SamplingSpec` says how it
sampled (``meta_info["sampling_spec"]``). Replaying step j means predicting the velocity at (latents_j, t_j) with the
policy being trained, then evaluating the shared SDE step at the recorded latents_{j+1}: that
gives log π_θ, μ_θ and s. There is one implementation of this (here) and of the step itself
(:mod:`verl_omni.pipelines.schedulers.flow_match_sde`); the engine, the one-process sanity step
and the benchmark all call it, which is what makes their numbers comparable.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from typing import NamedTuple

import torch

from verl_omni.pipelines.model_base import SDE_WINDOW
from verl_omni.pipelines.sampling import SamplingSpec
from verl_omni.pipelines.schedulers.flow_match_sde import (
    SDEStepOutput,
    schedule_sigmas,
    sde_step_with_logprob,
    step_indices_for_timesteps,
)
from verl_omni.utils.registry import Registry

logger = logging.getLogger(__name__)

# per-sample tensors every replayed batch carries (DESIGN.md §3, rollout ``extra_fields``); the model's
# conditioning tensors come on top (``ModelAdapter.required_keys``)
TRAJECTORY_KEYS = ("all_latents", "all_timesteps")


def num_replay_steps(batch: Mapping[str, torch.Tensor]) -> int:
    """W, the number of recorded transitions per sample."""
    return int(batch["all_timesteps"].shape[1])


def check_replay_batch(batch: Mapping[str, torch.Tensor], spec: SamplingSpec, adapter) -> None:
    """Fail early, naming the missing or inconsistent field, before any model work."""
    spec.require_stochastic()
    conditioning = adapter.required_keys(spec.uses_cfg)
    missing = [k for k in TRAJECTORY_KEYS + conditioning if k not in batch.keys()]
    if missing:
        cfg_only = set(missing) & (set(adapter.cfg_conditioning_keys) - set(adapter.conditioning_keys))
        hint = f" (true_cfg_scale > 1 needs {sorted(cfg_only)})" if cfg_only else ""
        raise KeyError(f"replay batch lacks {missing}{hint}; the rollout must record them")
    adapter.check_latents(batch["all_latents"], batch["all_timesteps"])


def prepare_scheduler(adapter, scheduler, spec: SamplingSpec, image_seq_len: int) -> None:
    """Set the scheduler to the rollout's schedule for this resolution."""
    adapter.set_schedule(scheduler, spec, image_seq_len)


def replay_step(
    adapter,
    transformer,
    scheduler,
    batch: Mapping[str, torch.Tensor],
    step: int,
    spec: SamplingSpec,
    vae_scale_factor: int = 1,
) -> SDEStepOutput:
    """log π_θ(x_{j+1} | x_j), μ_θ and s of recorded step ``step`` for every sample of ``batch``.

    Args:
        adapter: the model's training adapter (:class:`~verl_omni.pipelines.model_base.ModelAdapter`).
        transformer: the policy (with or without LoRA, sharded or not).
        scheduler: a flow-match scheduler already set by :func:`prepare_scheduler`.
        batch: per-sample tensors, ``all_latents`` ``[B, W+1, ...]``, ``all_timesteps`` ``[B, W]`` and the
            adapter's conditioning tensors.
        step: j in ``[0, W)``.
        spec: the rollout's sampling settings.
        vae_scale_factor: pixels per latent cell, for adapters that need it (from ``adapter.vae_scale_factor``).

    Returns:
        :class:`SDEStepOutput` in fp32, gradients flowing into the transformer when enabled.
    """
    x = batch["all_latents"][:, step]
    x_next = batch["all_latents"][:, step + 1]
    t = batch["all_timesteps"][:, step]
    velocity = adapter.step_velocity(transformer, batch, step, spec, vae_scale_factor)
    return sde_step_with_logprob(
        scheduler, velocity, t, x, spec.noise_level, prev_sample=x_next, sde_type=spec.sde_type
    )


# ---- replays by rollout record ------------------------------------------------------------------


class ReplayedSDEStep(NamedTuple):
    """One replayed SDE transition: :class:`SDEStepOutput`'s fields and the step's Δt.

    Args:
        prev_sample, log_prob, prev_sample_mean, std_dev_t: as in :class:`SDEStepOutput` (fp32).
        dt (`torch.Tensor`, ``[B]``): σ' − σ of each sample's step (< 0), fp32.
    """

    prev_sample: torch.Tensor
    log_prob: torch.Tensor
    prev_sample_mean: torch.Tensor
    std_dev_t: torch.Tensor
    dt: torch.Tensor


class SDEWindowReplay:
    """How the engine replays an ``SDE_WINDOW`` record: W recorded SDE transitions per sample.

    The engine asks the replay of the algorithm's record (:data:`REPLAYS`) for everything
    record-specific: the batch check, the scheduler set-up, the number of recorded steps, one step's
    replay and what a forward-only pass returns per step. A record kind with another replay
    (e.g. forward-noised clean samples) registers its own class under its record name.
    """

    trajectory_keys = TRAJECTORY_KEYS

    @staticmethod
    def check(batch: Mapping[str, torch.Tensor], spec: SamplingSpec, adapter) -> None:
        check_replay_batch(batch, spec, adapter)

    @staticmethod
    def prepare(adapter, scheduler, spec: SamplingSpec, batch: Mapping[str, torch.Tensor]) -> None:
        prepare_scheduler(adapter, scheduler, spec, batch["all_latents"].shape[2])

    @staticmethod
    def num_steps(batch: Mapping[str, torch.Tensor]) -> int:
        return num_replay_steps(batch)

    @staticmethod
    def step(adapter, module, scheduler, batch, step: int, spec: SamplingSpec, vae_scale_factor: int = 1):
        """:func:`replay_step` plus the step's Δt = σ' − σ ``[B]`` (losses that weigh steps by their size read it)."""
        out = replay_step(adapter, module, scheduler, batch, step, spec, vae_scale_factor)
        t = batch["all_timesteps"][:, step]
        index = step_indices_for_timesteps(scheduler, t, t.shape[0])
        sigmas = schedule_sigmas(scheduler, out.log_prob.device)
        index = index.to(sigmas.device)
        return ReplayedSDEStep(*out, dt=sigmas[index + 1] - sigmas[index])

    @staticmethod
    def outputs(replayed: ReplayedSDEStep) -> dict[str, torch.Tensor]:
        """Per-step tensors of a forward-only pass, stacked by the engine to ``[B, W, ...]``."""
        return {"log_probs": replayed.log_prob, "prev_sample_mean": replayed.prev_sample_mean}


REPLAYS: Registry = Registry(
    "replay",
    check=inspect.isclass,
    how_to_add="Register a replay class for the record with @register_replay('<record>') (docs/algorithms.md).",
)
register_replay = REPLAYS.register
register_replay(SDE_WINDOW)(SDEWindowReplay)


def get_replay(record: str):
    """The replay class of rollout record ``record`` (e.g. ``sde_window``)."""
    return REPLAYS.get(record)

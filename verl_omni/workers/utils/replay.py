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

import logging
from collections.abc import Mapping

import torch

from verl_omni.pipelines.sampling import SamplingSpec
from verl_omni.pipelines.schedulers.flow_match_sde import SDEStepOutput, sde_step_with_logprob

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

"""Replay of recorded rollouts: the trainer's side of the Flow-GRPO log-probability, and the forward-noised
clean samples of an ODE rollout (``ODESamplesReplay``, one class per rollout record in :data:`REPLAYS`).

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
from collections.abc import Callable, Mapping
from typing import NamedTuple

import torch

from verl_omni.algorithms.base import NOISE_GROUP_KEY
from verl_omni.pipelines.model_base import ODE_SAMPLES, SDE_WINDOW
from verl_omni.pipelines.recorder import CLEAN_LATENTS_KEY, TRAJECTORY_KEYS
from verl_omni.pipelines.sampling import SamplingSpec
from verl_omni.pipelines.schedulers.flow_match_sde import (
    SDEStepOutput,
    schedule_sigmas,
    sde_step_with_logprob,
    step_indices_for_timesteps,
)
from verl_omni.utils.registry import Registry
from verl_omni.workers.engine.fsdp.old_adapter import has_old_adapter, old_adapter_active

logger = logging.getLogger(__name__)


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
        prepare_scheduler(adapter, scheduler, spec, adapter.schedule_seq_len(batch["all_latents"][:, 0]))

    @staticmethod
    def num_steps(batch: Mapping[str, torch.Tensor], spec: SamplingSpec | None = None) -> int:
        return num_replay_steps(batch)

    @staticmethod
    def step(
        adapter, module, scheduler, batch, step: int, spec: SamplingSpec, vae_scale_factor: int = 1, reference=None
    ):
        """:func:`replay_step` plus the step's Δt = σ' − σ ``[B]`` (losses that weigh steps by their size read it).

        ``reference`` must be None: an SDE window's reference replays in the ``ref`` phase (``Phases.reference``).
        """
        if reference is not None:
            raise ValueError(
                "the sde_window replay has no in-update reference (Phases.reference_in_update is for ode_samples "
                "algorithms); its reference replays in the ref phase"
            )
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


class ForwardNoisedStep(NamedTuple):
    """The policies' velocities at a forward-noised clean sample (the ``ode_samples`` record's step).

    Args:
        clean (`torch.Tensor`, ``[B, S, C]``): x_0, the rollout's clean latents (fp32).
        noisy (`torch.Tensor`, ``[B, S, C]``): x_σ = (1 − σ)·x_0 + σ·ε, ε ~ N(0, I) drawn for this step.
        sigma (`torch.Tensor`, ``[B]``): σ of the schedule step (fp32).
        velocity (`torch.Tensor`, ``[B, S, C]``): v_θ(x_σ, σ) of the trained policy (fp32, with gradients).
        old_velocity (`torch.Tensor` or None): v_old(x_σ, σ) of the old-policy adapter (no gradients); None
            when the module has no old-policy adapter.
        reference_velocity (`torch.Tensor` or None): v_ref(x_σ, σ) of the reference policy (the LoRA disabled, or
            full fine-tuning's frozen copy; no gradients); None unless the algorithm declares
            ``Phases.reference_in_update``.
    """

    clean: torch.Tensor
    noisy: torch.Tensor
    sigma: torch.Tensor
    velocity: torch.Tensor
    old_velocity: torch.Tensor | None
    reference_velocity: torch.Tensor | None = None


def forward_noise(clean: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """ε ~ N(0, I) like ``clean``, one draw per :data:`NOISE_GROUP_KEY` value when the batch carries it."""
    if NOISE_GROUP_KEY not in batch.keys():
        return torch.randn_like(clean)
    groups = batch[NOISE_GROUP_KEY].to(clean.device)
    _, inverse = torch.unique(groups, return_inverse=True)
    draws = torch.randn((int(inverse.max()) + 1, *clean.shape[1:]), dtype=clean.dtype, device=clean.device)
    return draws[inverse]


class ODESamplesReplay:
    """How the engine replays an ``ODE_SAMPLES`` record: forward-noised clean samples, no recorded transition.

    Step j of the rollout's schedule (σ_j, timestep t_j as the model takes it) noises every sample's clean
    latents with a fresh ε (shared by the samples of one :data:`NOISE_GROUP_KEY`) and predicts the velocity there
    with the trained policy and, when the module carries it (:mod:`verl_omni.workers.engine.fsdp.old_adapter`),
    with the old-policy adapter, and, when the engine passes ``reference`` (its ``reference_policy`` context), with
    the reference policy. The number of steps is the schedule's T; the loss picks which of them it trains on
    (``replay_steps``).
    """

    trajectory_keys = (CLEAN_LATENTS_KEY,)

    @staticmethod
    def check(batch: Mapping[str, torch.Tensor], spec: SamplingSpec, adapter) -> None:
        missing = [k for k in (CLEAN_LATENTS_KEY, *adapter.required_keys(spec.uses_cfg)) if k not in batch.keys()]
        if missing:
            raise KeyError(f"replay batch lacks {missing}; an ODE rollout (noise_level 0) must record them")
        clean = batch[CLEAN_LATENTS_KEY]
        if clean.ndim != 1 + adapter.latent_ndim:
            raise ValueError(
                f"{CLEAN_LATENTS_KEY} {tuple(clean.shape)} must be [B] + a {adapter.latent_ndim}-D latent "
                f"({adapter.__name__}.latent_ndim; [B, S, C] packed tokens for images)"
            )

    @staticmethod
    def prepare(adapter, scheduler, spec: SamplingSpec, batch: Mapping[str, torch.Tensor]) -> None:
        prepare_scheduler(adapter, scheduler, spec, adapter.schedule_seq_len(batch[CLEAN_LATENTS_KEY]))

    @staticmethod
    def num_steps(batch: Mapping[str, torch.Tensor], spec: SamplingSpec | None = None) -> int:
        if spec is None:
            raise ValueError("the ode_samples replay needs the sampling spec for its number of steps")
        return spec.num_inference_steps

    @staticmethod
    def step(
        adapter,
        module,
        scheduler,
        batch,
        step: int,
        spec: SamplingSpec,
        vae_scale_factor: int = 1,
        reference: Callable | None = None,
    ):
        clean = batch[CLEAN_LATENTS_KEY].float()
        size = clean.shape[0]
        sigma = schedule_sigmas(scheduler, clean.device)[step].expand(size)
        s = sigma.view(-1, *([1] * (clean.ndim - 1)))
        noisy = (1 - s) * clean + s * forward_noise(clean, batch)
        view = {k: batch[k] for k in adapter.required_keys(spec.uses_cfg)}
        view["all_latents"] = noisy[:, None]
        view["all_timesteps"] = scheduler.timesteps[step].to(clean.device).float().expand(size)[:, None]
        old = None
        if has_old_adapter(module):
            # the old policy first: switching adapters resets which tensors are trainable
            with torch.no_grad(), old_adapter_active(module):
                old = adapter.step_velocity(module, view, 0, spec, vae_scale_factor).float()
        ref = None
        if reference is not None:
            # before the trained forward too: disabling and re-enabling the LoRA resets which tensors are trainable
            with torch.no_grad(), reference() as reference_module:
                ref = adapter.step_velocity(reference_module, view, 0, spec, vae_scale_factor).float()
        velocity = adapter.step_velocity(module, view, 0, spec, vae_scale_factor).float()
        return ForwardNoisedStep(clean, noisy, sigma, velocity, old, ref)

    @staticmethod
    def outputs(replayed: ForwardNoisedStep) -> dict[str, torch.Tensor]:
        return {"velocity": replayed.velocity}


REPLAYS: Registry = Registry(
    "replay",
    check=inspect.isclass,
    how_to_add=(
        "Register a replay class for the record with @register_replay('<record>') (docs/extending/algorithm.md)."
    ),
)
register_replay = REPLAYS.register
register_replay(SDE_WINDOW)(SDEWindowReplay)
register_replay(ODE_SAMPLES)(ODESamplesReplay)


def get_replay(record: str):
    """The replay class of rollout record ``record`` (e.g. ``sde_window``)."""
    return REPLAYS.get(record)

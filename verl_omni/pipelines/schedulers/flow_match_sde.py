"""Stochastic (SDE / CPS) flow-matching step with its Gaussian log-probability.

This is the only implementation of the Flow-GRPO transition kernel in the project: the rollout
pipeline samples with it and records ``log_prob``; the trainer replays the same transition with
it to get ``log π_θ`` and the mean used by the KL term. Keeping one copy is what makes the
rollout/trainer log-prob consistency check meaningful.

Math (docs/design.md, "Transition kernels"), sigmas in (0, 1], σ = 1 is pure noise, step σ → σ', Δt = σ' − σ < 0,
``v`` the (CFG-combined) velocity, ``a`` the noise level:

* ``sde``: s = a·sqrt(σ / (1 − σ)) (σ_1 in the denominator when σ = 1);
  μ = x·(1 + s²Δt/(2σ)) + v·(1 + s²(1 − σ)/(2σ))·Δt; x' = μ + s·sqrt(−Δt)·ε;
  log p = mean over non-batch dims of the Gaussian log-density of x' under N(μ, s²(−Δt)).
* ``cps``: s = σ'·sin(aπ/2); x̂0 = x − σv; x̂1 = x + (1 − σ)v; μ = (1 − σ')x̂0 + sqrt(σ'² − s²)·x̂1;
  x' = μ + s·ε; log p = −mean (x' − μ)² (no normalizer, as in the Flow-GRPO reference code).
* ``dance`` (DanceGRPO, docs/design.md "DanceGRPO", (D1)-(D3)): the rectified-flow SDE with a constant diffusion
  coefficient a (the paper's η): x̂0 = x − σv, score ≈ −(x − (1 − σ)x̂0)/σ² = −(x + (1 − σ)v)/σ,
  μ = x + Δt·(v − ½a²·score) = x·(1 + a²Δt/(2σ)) + v·Δt·(1 + a²(1 − σ)/(2σ)); x' = μ + a·sqrt(−Δt)·ε;
  log p as for ``sde`` with std a·sqrt(−Δt). (The mean of ``sde`` with a constant s = a.)

A noise level of 0 gives the deterministic Euler (ODE) step for both types; its log-prob is
undefined and returned as NaN so that any use of it is visible.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from diffusers.utils.torch_utils import randn_tensor

SDE_TYPES = ("sde", "cps", "dance")
# the largest meaningful noise level a of each type. ``sde``: on the first step (σ = 1, σ_1 in the
# denominator) the mean's coefficient of x is 1 − a²/2, negative above a = sqrt(2) (the mean flips
# the latent's sign and the step's std, ~a, dwarfs the unit-variance latent). ``cps``: s = σ'·sin(aπ/2)
# grows up to a = 1 (the whole σ' is noise); above 1 it shrinks again (a and 2 − a are the same kernel).
# ``dance``: its mean's coefficient of x is 1 + a²Δt/(2σ), which is 1 − a²/2 on the last step (σ' = 0).
MAX_NOISE_LEVEL = {"sde": math.sqrt(2.0), "cps": 1.0, "dance": math.sqrt(2.0)}


class SDEStepOutput(NamedTuple):
    """Result of one stochastic step; unpacks as ``(prev_sample, log_prob, prev_sample_mean, std_dev_t)``.

    Args:
        prev_sample (`torch.Tensor`, same shape as ``sample``): x', fp32.
        log_prob (`torch.Tensor`, shape ``[B]``): per-sample log p(x' | x), NaN where the noise level is 0.
        prev_sample_mean (`torch.Tensor`, same shape as ``sample``): μ, fp32.
        std_dev_t (`torch.Tensor`, shape ``[B, 1, ...]``): s, broadcastable to ``sample`` (``sde``: the diffusion
            coefficient, the step's std is s·sqrt(−Δt); ``cps``: the step's std; ``dance``: a, std a·sqrt(−Δt)).
    """

    prev_sample: torch.Tensor
    log_prob: torch.Tensor
    prev_sample_mean: torch.Tensor
    std_dev_t: torch.Tensor


def _batch_view(values: torch.Tensor, ndim: int) -> torch.Tensor:
    """Reshape a ``[B]`` tensor to ``[B, 1, ..., 1]`` so it broadcasts over a sample of ``ndim`` dims."""
    return values.reshape(-1, *([1] * (ndim - 1)))


def step_indices_for_timesteps(scheduler: FlowMatchEulerDiscreteScheduler, timestep, batch_size: int) -> torch.Tensor:
    """Index into ``scheduler.timesteps`` of each sample's timestep (scalar or ``[B]``), as a ``[B]`` long tensor.

    Matches to the nearest scheduled timestep (recorded values may have travelled through
    another dtype) and raises if a timestep is not on the schedule.
    """
    schedule = scheduler.timesteps
    if schedule is None or len(schedule) == 0:
        raise ValueError("scheduler has no timesteps: call scheduler.set_timesteps(...) before stepping")
    t = torch.as_tensor(timestep, dtype=torch.float64).reshape(-1).cpu()
    if t.numel() == 1:
        t = t.expand(batch_size)
    if t.numel() != batch_size:
        raise ValueError(f"timestep has {t.numel()} values but the batch has {batch_size} samples")
    dist = (t[:, None] - schedule.to(torch.float64).cpu()[None, :]).abs()
    best, idx = dist.min(dim=1)
    tol = 1e-3 * max(1.0, float(schedule.abs().max()))
    if bool((best > tol).any()):
        bad = t[best > tol].tolist()
        raise ValueError(f"timestep values {bad} are not on the scheduler's schedule {schedule.tolist()}")
    return idx


def _noise_levels(noise_level, batch_size: int) -> torch.Tensor:
    levels = torch.as_tensor(noise_level, dtype=torch.float32).reshape(-1).cpu()
    if levels.numel() == 1:
        levels = levels.expand(batch_size)
    if levels.numel() != batch_size:
        raise ValueError(f"noise_level has {levels.numel()} values but the batch has {batch_size} samples")
    if not bool(torch.isfinite(levels).all()) or bool((levels < 0).any()):
        raise ValueError(f"noise_level must be finite and >= 0, got {levels.tolist()}")
    return levels


def sde_step_with_logprob(
    scheduler: FlowMatchEulerDiscreteScheduler,
    model_output: torch.Tensor,
    timestep: float | torch.Tensor,
    sample: torch.Tensor,
    noise_level: float | torch.Tensor = 0.7,
    prev_sample: torch.Tensor | None = None,
    generator: torch.Generator | list[torch.Generator] | None = None,
    sde_type: str = "sde",
) -> SDEStepOutput:
    """One stochastic flow-matching step σ → σ' and the log-probability of its result.

    Args:
        scheduler: a flow-match scheduler whose ``set_timesteps`` has been called.
        model_output (`torch.Tensor`, ``[B, ...]``): velocity v (after CFG).
        timestep (`float` or `torch.Tensor` of shape ``[B]``): each sample's current timestep, a value
            of ``scheduler.timesteps``; samples may be at different steps (trainer replay).
        sample (`torch.Tensor`, ``[B, ...]``): current latents x.
        noise_level (`float` or `torch.Tensor` ``[B]``, defaults to 0.7): a >= 0 per sample; 0 is the ODE step.
        prev_sample (`torch.Tensor`, *optional*): a given x' (replay); sampled when ``None``.
        generator (`torch.Generator` or list of one per sample, *optional*): noise source when sampling.
        sde_type (`str`, defaults to ``"sde"``): one of :data:`SDE_TYPES`.

    Returns:
        :class:`SDEStepOutput` (a tuple ``(prev_sample, log_prob, prev_sample_mean, std_dev_t)``); fp32.
    """
    if sde_type not in SDE_TYPES:
        raise ValueError(f"sde_type must be one of {SDE_TYPES}, got {sde_type!r}")
    if model_output.shape != sample.shape:
        raise ValueError(f"model_output shape {tuple(model_output.shape)} != sample shape {tuple(sample.shape)}")
    if prev_sample is not None and prev_sample.shape != sample.shape:
        raise ValueError(f"prev_sample shape {tuple(prev_sample.shape)} != sample shape {tuple(sample.shape)}")
    batch = sample.shape[0]
    idx = step_indices_for_timesteps(scheduler, timestep, batch)
    return sde_transition(
        model_output,
        sample,
        schedule_sigmas(scheduler),
        idx,
        _noise_levels(noise_level, batch),
        prev_sample=prev_sample,
        generator=generator,
        sde_type=sde_type,
    )


def schedule_sigmas(scheduler: FlowMatchEulerDiscreteScheduler, device: torch.device | str = "cpu") -> torch.Tensor:
    """The scheduler's σ values ``[T+1]`` in fp32 on ``device``: what :func:`sde_transition` indexes."""
    return scheduler.sigmas.to(device=device, dtype=torch.float32)


def sde_transition(
    model_output: torch.Tensor,
    sample: torch.Tensor,
    sigmas: torch.Tensor,
    step: int | torch.Tensor,
    noise_level: torch.Tensor,
    prev_sample: torch.Tensor | None = None,
    generator: torch.Generator | list[torch.Generator] | None = None,
    sde_type: str = "sde",
    noise: torch.Tensor | None = None,
) -> SDEStepOutput:
    """The step of :func:`sde_step_with_logprob` once the schedule position is known, with no host sync
    when ``sigmas``, ``noise_level`` and ``noise`` are on the sample's device and ``step`` is an int
    (the rollout's loop; the step-by-timestep lookup reads values on the host).

    Args:
        model_output, sample, prev_sample, generator, sde_type: as in :func:`sde_step_with_logprob`.
        sigmas (`torch.Tensor`, ``[T+1]``): :func:`schedule_sigmas` of the schedule.
        step (`int` or `torch.Tensor` ``[B]``): the step every sample (or each sample) takes, σ = sigmas[step].
        noise_level (`torch.Tensor`, ``[B]`` or scalar): a >= 0 per sample (not checked here).
        noise (`torch.Tensor`, *optional*): the standard-normal draw ε to sample with instead of drawing
            from ``generator`` (a sample at noise level 0 ignores its row).
    """
    ndim, device = sample.ndim, sample.device

    # 1. Per-sample sigmas (fp32 math throughout, whatever the model's dtype).
    sigma = _batch_view(sigmas[step], ndim).to(device)
    sigma_next = _batch_view(sigmas[step + 1], ndim).to(device)
    a = _batch_view(noise_level.to(torch.float32), ndim).to(device)
    x = sample.to(torch.float32)
    v = model_output.to(torch.float32)
    dt = sigma_next - sigma

    # 2. Mean and standard deviation of the transition.
    if sde_type == "sde":
        sigma_1 = sigmas[1] if len(sigmas) > 1 else sigmas[0]
        denom = 1 - torch.where(sigma == 1, sigma_1.to(device), sigma)
        std_dev_t = torch.sqrt(sigma / denom) * a
        mean = x * (1 + std_dev_t**2 / (2 * sigma) * dt) + v * (1 + std_dev_t**2 * (1 - sigma) / (2 * sigma)) * dt
        noise_scale = std_dev_t * torch.sqrt(-dt)
    elif sde_type == "dance":
        # DanceGRPO's mean x + Δt·(v − ½a²·score) with the score's x̂0 substituted: the authors' form subtracts
        # two O(1) terms to get an O(σ) one and divides by σ², which costs fp32 digits as σ → 0
        std_dev_t = a
        mean = x * (1 + a**2 * dt / (2 * sigma)) + v * (1 + a**2 * (1 - sigma) / (2 * sigma)) * dt
        noise_scale = a * torch.sqrt(-dt)
    else:
        std_dev_t = sigma_next * torch.sin(a * math.pi / 2)
        x0_hat = x - sigma * v
        x1_hat = x + (1 - sigma) * v
        mean = (1 - sigma_next) * x0_hat + torch.sqrt((sigma_next**2 - std_dev_t**2).clamp_min(0)) * x1_hat
        noise_scale = std_dev_t

    # 3. Sample x' unless it is given (replay).
    if prev_sample is None:
        eps = (
            noise
            if noise is not None
            else randn_tensor(x.shape, generator=generator, device=device, dtype=torch.float32)
        )
        prev_sample = mean + noise_scale * eps
    prev_sample = prev_sample.to(torch.float32)

    # 4. Log-probability, averaged over every non-batch dim; NaN for deterministic samples.
    # (a safe scale where a == 0 keeps NaN out of gradients of the other samples)
    deterministic = (a == 0).expand(x.shape[0], *a.shape[1:])
    diff_sq = (prev_sample.detach() - mean) ** 2
    if sde_type in ("sde", "dance"):
        scale = torch.where(deterministic, torch.ones_like(noise_scale), noise_scale)
        log_prob = -diff_sq / (2 * scale**2) - torch.log(scale) - 0.5 * math.log(2 * math.pi)
    else:
        log_prob = -diff_sq
    log_prob = log_prob.mean(dim=tuple(range(1, ndim)))
    log_prob = torch.where(deterministic.reshape(-1), torch.full_like(log_prob, float("nan")), log_prob)
    return SDEStepOutput(prev_sample, log_prob, mean, std_dev_t)


def ode_step(sample: torch.Tensor, model_output: torch.Tensor, dt: float) -> torch.Tensor:
    """The deterministic step x + v·dt in fp32 (``dt`` = σ' − σ as an fp32 value): what
    :func:`sde_step_with_logprob` samples at noise level 0 (bit for bit with ``"sde"``), without its
    noise draw, its log-prob and the host syncs of its timestep lookup (rollout steps outside the window).
    """
    return sample.to(torch.float32) + dt * model_output.to(torch.float32)


def step_dts(sigmas: torch.Tensor) -> list[float]:
    """σ' − σ of every step of a :func:`schedule_sigmas` table, in fp32 as the SDE step computes it."""
    sigmas = sigmas.cpu()
    return [float(sigmas[i + 1] - sigmas[i]) for i in range(len(sigmas) - 1)]


class FlowMatchSDEDiscreteScheduler(FlowMatchEulerDiscreteScheduler):
    """diffusers' flow-match Euler scheduler plus the stochastic step used by Flow-GRPO.

    Loads from any ``FlowMatchEulerDiscreteScheduler`` config (e.g. Qwen-Image's), so a real
    checkpoint's ``scheduler/`` directory works unchanged.
    """

    # ``scheduler.step_with_logprob(...)`` is ``sde_step_with_logprob(scheduler, ...)``
    step_with_logprob = sde_step_with_logprob


def sample_sde_window_start(seed: int, num_steps: int, window_size: int, window_range: tuple[int, int]) -> int:
    """First SDE step of a sample's window: uniform in ``[r0, r1 - window_size]``, deterministic per seed.

    Args:
        seed: the sample's seed (the rollout derives one per sample).
        num_steps: denoising steps of the schedule.
        window_size: W, the number of stochastic (recorded) steps.
        window_range: ``(r0, r1)``, the steps the window may cover, ``0 <= r0 < r1 <= num_steps``.
    """
    r0, r1 = window_range
    if window_size < 1:
        raise ValueError(f"window_size must be >= 1, got {window_size}")
    if not 0 <= r0 < r1 <= num_steps:
        raise ValueError(f"window_range {window_range} must satisfy 0 <= r0 < r1 <= num_steps={num_steps}")
    if r1 - r0 < window_size:
        raise ValueError(f"window_range {window_range} is shorter than window_size={window_size}")
    gen = torch.Generator().manual_seed(int(seed))
    return r0 + int(torch.randint(0, r1 - window_size - r0 + 1, (1,), generator=gen))


def window_noise_levels(num_steps: int, start: int, window_size: int, noise_level: float) -> list[float]:
    """Noise level of each step: ``noise_level`` on ``[start, start + window_size)``, 0 (ODE) elsewhere."""
    if noise_level <= 0:
        raise ValueError(f"noise_level must be > 0 inside the SDE window, got {noise_level}")
    if not 0 <= start <= num_steps - window_size:
        raise ValueError(f"window [{start}, {start + window_size}) is outside the {num_steps} steps")
    return [noise_level if start <= i < start + window_size else 0.0 for i in range(num_steps)]

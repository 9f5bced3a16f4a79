"""MixGRPO's rollout pieces: the SDE window that slides with training, and the faster ODE after it.

MixGRPO (Li et al., 2025, arXiv:2507.21802; ``docs/design.md`` "MixGRPO") samples the SDE only inside a
window of W steps shared by every sample of a step and moves that window with training progress
(its "progressive" strategy); outside the window it samples the ODE. Because no step after the
window is trained, the ODE there may use a higher-order solver on fewer steps ("MixGRPO-Flash"):
the post-window part of the σ table is thinned and stepped with the multistep DPM-Solver++ in the
flow-matching parametrization (α = 1 − σ, data prediction x̂0 = x − σv).

Everything here is a pure function of host numbers or tensors, so the rollout recorder, the tests
and the docs share one definition.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

WINDOW_SCHEDULES = ("random", "progressive")
ODE_SOLVERS = ("euler", "dpmsolver++")
ODE_SOLVER_ORDERS = (1, 2)


def progressive_window_start(
    global_step: int, window_size: int, window_range: tuple[int, int], stride: int, shift_every: int
) -> int:
    """First SDE step of every sample at trainer step ``global_step`` under MixGRPO's progressive schedule.

    The window starts at r0 on the first training step (``global_step`` 1; 0, before training, is the same)
    and moves ``stride`` steps later every ``shift_every`` training steps; once it would pass r1 − W it rolls
    back to r0 (the authors' ``roll_back``). ``stride`` 0 keeps it at r0 (their "Flash*" setting).

    Args:
        global_step: the trainer's step counter (``RayFlowGRPOTrainer.global_steps``; 1 is the first step).
        window_size: W.
        window_range: ``(r0, r1)``, the steps a window may cover.
        stride: steps the window moves per shift (>= 0).
        shift_every: training steps between two shifts (>= 1).
    """
    r0, r1 = window_range
    if stride < 0 or shift_every < 1:
        raise ValueError(f"stride must be >= 0 and shift_every >= 1, got stride={stride}, shift_every={shift_every}")
    if r1 - r0 < window_size:
        raise ValueError(f"window_range {window_range} is shorter than window_size={window_size}")
    if stride == 0:
        return r0
    positions = (r1 - window_size - r0) // stride + 1
    shifts = max(int(global_step) - 1, 0) // shift_every
    return r0 + stride * (shifts % positions)


def post_window_indices(num_steps: int, window_end: int, ratio: float) -> list[int]:
    """Indices into the σ table ``[T+1]`` that the ODE visits after the window ``[.., window_end)``.

    MixGRPO-Flash keeps ``K = max(int((T − window_end + 1)·ratio), 2)`` points from σ_{window_end} down to
    σ_T = 0, evenly spaced in step index (so K − 1 ODE steps replace T − window_end). The authors' code
    re-evaluates the SD3 time shift at evenly spaced unshifted times, which gives the same points whenever
    the spacing is whole; we stay on the model's own σ table (any model's shift) and round. Their K may be
    1, which ends sampling at σ_{window_end} (a noisy image): we keep at least 2 points (one step to σ = 0).

    Returns ``[window_end]`` alone when the window ends the schedule (nothing left to step).
    """
    if not 0 < ratio <= 1:
        raise ValueError(f"ratio must be in (0, 1], got {ratio}")
    if not 0 <= window_end <= num_steps:
        raise ValueError(f"window_end={window_end} is outside the {num_steps} steps")
    remaining = num_steps - window_end
    if remaining == 0:
        return [window_end]
    points = min(max(int((remaining + 1) * ratio), 2), remaining + 1)
    return [window_end + round(k * remaining / (points - 1)) for k in range(points)]


def compressed_schedule(
    sigmas: torch.Tensor, timesteps: torch.Tensor, window_end: int, ratio: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """σ ``[T'+1]`` and timesteps ``[T']`` of a rollout whose steps after ``window_end`` are thinned
    (:func:`post_window_indices`); the steps up to the window's end are the original ones."""
    steps = len(sigmas) - 1
    post = post_window_indices(steps, window_end, ratio)
    keep = list(range(window_end)) + post
    index = torch.tensor(keep, dtype=torch.long, device=sigmas.device)
    return sigmas[index], timesteps[index[:-1].to(timesteps.device)]


def _lambda(sigma: float) -> float:
    """λ = log(α/σ) with α = 1 − σ (the half log-SNR of the flow-matching path)."""
    return math.log(1 - sigma) - math.log(sigma)


def dpm_solver_pp_step(
    sample: torch.Tensor,
    x0: torch.Tensor,
    sigmas: Sequence[float],
    step: int,
    previous_x0: torch.Tensor | None = None,
    order: int = 2,
) -> torch.Tensor:
    """One deterministic multistep DPM-Solver++ step σ_step → σ_{step+1} (data prediction, "midpoint" 2M).

    With α = 1 − σ, λ = log(α/σ), h = λ' − λ and ``x0`` = x − σv at this step:

    * first order: x' = (σ'/σ)·x − α'·(e^{−h} − 1)·x̂0;
    * second order, with x̂0_prev of the step before (σ_prev): r = (λ − λ_prev)/h, D1 = (x̂0 − x̂0_prev)/r,
      x' = first-order x' − ½·α'·(e^{−h} − 1)·D1.

    The step to σ' = 0 returns x̂0 (the first-order limit, as the authors' solver does on its final step).
    The step from σ = 1 (α = 0, λ = −∞, so e^{−h} = 0) is the first-order limit x' = σ'·x + (1 − σ')·x̂0: the
    log of α = 0 has no float value, and no step before it exists for a second-order term. A step without a usable previous x̂0 (none, or taken at σ = 1 where λ = −∞) is first order. The
    coefficients are host floats (the σ table on the host), so a step reads nothing back from the device.

    Args:
        sample (`torch.Tensor`): x at σ_step.
        x0 (`torch.Tensor`): the data prediction x − σ·v at this step.
        sigmas (`Sequence[float]`, ``T+1`` values): the (possibly compressed) σ table.
        step: the step index.
        previous_x0 (`torch.Tensor`, *optional*): the data prediction of step ``step − 1``.
        order: 1 or 2.

    Returns:
        x at σ_{step+1}, fp32.
    """
    if order not in ODE_SOLVER_ORDERS:
        raise ValueError(f"order must be one of {ODE_SOLVER_ORDERS}, got {order}")
    x, m0 = sample.to(torch.float32), x0.to(torch.float32)
    sigma_s, sigma_t = float(sigmas[step]), float(sigmas[step + 1])
    if sigma_t == 0.0:
        return m0.clone()
    if sigma_s == 1.0:
        return sigma_t * x + (1 - sigma_t) * m0
    h = _lambda(sigma_t) - _lambda(sigma_s)
    phi = math.expm1(-h)
    out = (sigma_t / sigma_s) * x - ((1 - sigma_t) * phi) * m0
    if order == 2 and previous_x0 is not None and step >= 1 and float(sigmas[step - 1]) < 1.0:
        h_prev = _lambda(sigma_s) - _lambda(float(sigmas[step - 1]))
        d1 = (m0 - previous_x0.to(torch.float32)) * (h / h_prev)
        out = out - (0.5 * (1 - sigma_t) * phi) * d1
    return out


def flash_model_calls(num_steps: int, window_end: int, ratio: float) -> int:
    """Model calls of a MixGRPO-Flash rollout (one per step of the compressed schedule)."""
    return window_end + len(post_window_indices(num_steps, window_end, ratio)) - 1

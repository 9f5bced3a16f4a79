"""MixGRPO's sliding window and Flash ODE, each against an independent re-derivation in the test."""

import math

import pytest
import torch

from verl_omni.pipelines.schedulers.mix_ode import (
    compressed_schedule,
    dpm_solver_pp_step,
    flash_model_calls,
    post_window_indices,
    progressive_window_start,
)


def authors_progressive_starts(num_training_steps, window_range, window_size, stride, shift_every):
    """The window start of each training step, by stepping the authors' progressive state machine (start at r0,
    count iterations, move by ``stride`` after ``shift_every`` of them, roll back to r0 past the last start)."""
    r0, r1 = window_range
    last = r1 - window_size
    start, count, starts = r0, 0, []
    for _ in range(num_training_steps):
        starts.append(start)
        count += 1
        if count >= shift_every:
            count = 0
            start += stride
        if start > last:
            start = r0
    return starts


@pytest.mark.parametrize(
    ("window_range", "window_size", "stride", "shift_every"),
    [((0, 10), 4, 1, 1), ((0, 23), 4, 1, 3), ((2, 9), 2, 2, 2), ((0, 6), 6, 1, 1), ((1, 10), 3, 0, 1)],
)
def test_progressive_window_slides_and_rolls_back_as_the_authors_schedule(
    window_range, window_size, stride, shift_every
):
    want = authors_progressive_starts(150, window_range, window_size, stride, shift_every)
    got = [progressive_window_start(step, window_size, window_range, stride, shift_every) for step in range(1, 151)]
    assert got == want
    r0, r1 = window_range
    assert all(r0 <= s <= r1 - window_size for s in got)
    if stride and r1 - r0 > window_size:
        assert r1 - window_size - (r1 - window_size - r0) % stride in got  # the last full window is reached


def test_the_step_before_training_is_the_first_window():
    assert progressive_window_start(0, 2, (3, 8), 1, 1) == progressive_window_start(1, 2, (3, 8), 1, 1) == 3


@pytest.mark.parametrize(
    ("num_steps", "window_end", "ratio"), [(25, 4, 0.4), (25, 7, 0.4), (25, 4, 0.2), (16, 10, 0.5), (10, 3, 1.0)]
)
def test_post_window_points_are_the_authors_points_when_their_spacing_is_whole(num_steps, window_end, ratio):
    got = post_window_indices(num_steps, window_end, ratio)
    # the authors: K = int((T − last)·ratio) points of linspace(t_{last+1}, 0, K) in unshifted time t = 1 − i/T
    last = window_end - 1
    points = max(int((num_steps - last) * ratio), 2)
    times = torch.linspace(1, 0, num_steps + 1, dtype=torch.float64)[last + 1].item()
    theirs = [(1 - times * (1 - k / (points - 1))) * num_steps for k in range(points)]
    assert len(got) == points and got[0] == window_end and got[-1] == num_steps
    assert all(b > a for a, b in zip(got, got[1:], strict=False))
    if (num_steps - window_end) % (points - 1) == 0:
        assert got == [round(t) for t in theirs]
    else:
        assert max(abs(g - t) for g, t in zip(got, theirs, strict=True)) <= 0.5 + 1e-9


def test_post_window_edges_keep_one_step_to_zero_and_nothing_past_the_end():
    assert post_window_indices(10, 10, 0.4) == [10]  # the window ends the schedule
    assert post_window_indices(10, 9, 0.1) == [9, 10]  # the authors' K = 1 would stop at σ_9
    assert post_window_indices(10, 2, 1.0) == list(range(2, 11))
    assert flash_model_calls(25, 4, 0.4) == 4 + 8 - 1
    with pytest.raises(ValueError, match="ratio"):
        post_window_indices(10, 2, 0.0)


def test_compressed_schedule_keeps_the_window_steps_and_thins_the_rest():
    sigmas = torch.linspace(1, 0, 11)
    timesteps = sigmas[:-1] * 1000
    s, t = compressed_schedule(sigmas, timesteps, 3, 0.5)
    keep = [0, 1, 2] + post_window_indices(10, 3, 0.5)
    assert s.tolist() == sigmas[keep].tolist() and t.tolist() == timesteps[keep[:-1]].tolist()


def dpm_reference(x, m0, m_prev, s_prev, s, s_next):
    """DPM-Solver++(2M), midpoint, in float64 with α = 1 − σ: λ = log α − log σ, h = λ' − λ, r = (λ − λ_prev)/h,
    x' = (σ'/σ)x + α'(1 − e^{−h})(m0 + (m0 − m_prev)/(2r)); at σ' = 0 the data prediction itself."""
    if s_next == 0:
        return m0.double()
    lam = lambda sig: math.log(1 - sig) - math.log(sig)  # noqa: E731
    h = lam(s_next) - lam(s)
    d = m0.double()
    if m_prev is not None:
        r = (lam(s) - lam(s_prev)) / h
        d = d + (m0.double() - m_prev.double()) / (2 * r)
    return (s_next / s) * x.double() + (1 - s_next) * (1 - math.exp(-h)) * d


def test_dpm_solver_step_matches_the_second_order_formula_and_its_edges():
    g = torch.Generator().manual_seed(0)
    x, m0, m1 = (torch.randn(2, 5, 3, generator=g) for _ in range(3))
    sigmas = [1.0, 0.8, 0.55, 0.3, 0.0]
    second = dpm_solver_pp_step(x, m0, sigmas, 2, m1, order=2)
    torch.testing.assert_close(second.double(), dpm_reference(x, m0, m1, 0.8, 0.55, 0.3), rtol=1e-5, atol=1e-5)
    first = dpm_solver_pp_step(x, m0, sigmas, 2, m1, order=1)
    torch.testing.assert_close(first.double(), dpm_reference(x, m0, None, 0.8, 0.55, 0.3), rtol=1e-5, atol=1e-5)
    # the step after σ = 1 has no usable previous prediction (λ = −∞): first order
    after_one = dpm_solver_pp_step(x, m0, sigmas, 1, m1, order=2)
    torch.testing.assert_close(after_one.double(), dpm_reference(x, m0, None, 1.0, 0.8, 0.55), rtol=1e-5, atol=1e-5)
    # the last step lands on the data prediction
    assert torch.equal(dpm_solver_pp_step(x, m0, sigmas, 3, m1), m0)


def test_dpm_solver_step_from_pure_noise_is_the_first_order_limit():
    """At σ = 1, λ = −∞: the step is the limit σ → 1 of the first-order formula, the DDIM step that re-noises x̂0
    with the noise x itself (ε̂ = (x − α·x̂0)/σ = x when α = 0), for either order."""
    g = torch.Generator().manual_seed(1)
    x, m0, m1 = (torch.randn(2, 5, 3, generator=g, dtype=torch.float64) for _ in range(3))
    sigmas = [1.0, 0.7, 0.0]
    ddim = 0.7 * x + 0.3 * m0
    for order in (1, 2):
        step = dpm_solver_pp_step(x, m0, sigmas, 0, m1, order=order)
        torch.testing.assert_close(step.double(), ddim, rtol=1e-6, atol=1e-6)
    near_one = dpm_reference(x, m0, None, 1.0, 1 - 1e-9, 0.7)
    torch.testing.assert_close(ddim, near_one, rtol=1e-6, atol=1e-6)


def gaussian_flow(mu0: float, s0: float):
    """Exact pieces of the flow x_σ = (1 − σ)x0 + σε for x0 ~ N(mu0, s0²): the data prediction E[x0 | x_σ] and the
    ODE's solution from x_1 = z, x_σ = (1 − σ)mu0 + sqrt((1 − σ)²s0² + σ²)·z."""

    def x0_pred(x, sigma):
        var = (1 - sigma) ** 2 * s0**2 + sigma**2
        return mu0 + (1 - sigma) * s0**2 / var * (x - (1 - sigma) * mu0)

    def exact(z, sigma):
        return (1 - sigma) * mu0 + math.sqrt((1 - sigma) ** 2 * s0**2 + sigma**2) * z

    return x0_pred, exact


def test_dpm_solver_on_a_third_of_the_steps_tracks_the_exact_ode_as_well_as_euler_on_all():
    x0_pred, exact = gaussian_flow(mu0=0.7, s0=0.3)
    z = torch.randn(64, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    shift = 3.0
    t = torch.linspace(1, 0, 26, dtype=torch.float64)
    sigmas = (shift * t / (1 + (shift - 1) * t)).tolist()
    start = 4  # the window ended at step 4 (σ_4); the solvers go from x(σ_4) to σ_22, a point of both grids
    kept = post_window_indices(25, start, 0.4)
    assert kept[-2] == 22
    thin = [sigmas[i] for i in kept[:-1]]
    # (the last step, to σ = 0, returns the data prediction for every solver: it is not compared)

    def run(table, order):
        x, previous = exact(z, table[0]).float(), None
        for k in range(len(table) - 1):
            m0 = x0_pred(x.double(), table[k]).float()
            if order == 0:
                v = (x - m0) / table[k]
                x = x + (table[k + 1] - table[k]) * v
            else:
                x = dpm_solver_pp_step(x, m0, table, k, previous, order=order)
            previous = m0
        return x.double()

    target = exact(z, sigmas[22])
    euler_full = (run(sigmas[start:23], 0) - target).abs().max().item()
    euler_thin = (run(thin, 0) - target).abs().max().item()
    dpm_thin = (run(thin, 2) - target).abs().max().item()
    assert 3 * (len(thin) - 1) == 22 - start  # a third of the model calls
    # measured: DPM-Solver++ 0.036, Euler on the same 6 steps 0.086, Euler on all 18 steps 0.031
    assert dpm_thin < 0.5 * euler_thin and dpm_thin < 1.5 * euler_full

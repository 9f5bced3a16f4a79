"""The SDE/CPS step against independent float64 formulas, its sampling statistics and its errors."""

import math

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from verl_omni.pipelines.qwen_image.tiny_model import QWEN_IMAGE_SCHEDULER_CONFIG
from verl_omni.pipelines.schedulers import (
    FlowMatchSDEDiscreteScheduler,
    ode_step,
    sample_sde_window_start,
    schedule_sigmas,
    sde_step_with_logprob,
    sde_transition,
    step_dts,
    window_noise_levels,
)

NUM_STEPS = 10


@pytest.fixture
def scheduler():
    sched = FlowMatchSDEDiscreteScheduler(**QWEN_IMAGE_SCHEDULER_CONFIG)
    sched.set_timesteps(NUM_STEPS, mu=0.8)
    return sched


def reference_mean_and_scale(sched, idx, x, v, a, sde_type):
    """docs/design.md ("Transition kernels") written out again in float64, per sample, independently of the module."""
    sig = sched.sigmas.double()
    means, scales = [], []
    for b in range(x.shape[0]):
        s0, s1 = sig[idx[b]].item(), sig[idx[b] + 1].item()
        dt = s1 - s0
        xb, vb = x[b].double(), v[b].double()
        if sde_type == "sde":
            den = 1 - (sig[1].item() if s0 == 1 else s0)
            s = a[b] * math.sqrt(s0 / den)
            mean = xb * (1 + s**2 * dt / (2 * s0)) + vb * (1 + s**2 * (1 - s0) / (2 * s0)) * dt
            scale = s * math.sqrt(-dt)
        else:
            s = s1 * math.sin(a[b] * math.pi / 2)
            x0, x1 = xb - s0 * vb, xb + (1 - s0) * vb
            mean = (1 - s1) * x0 + math.sqrt(max(s1**2 - s**2, 0.0)) * x1
            scale = s
        means.append(mean)
        scales.append(scale)
    return torch.stack(means), torch.tensor(scales, dtype=torch.float64)


@pytest.mark.parametrize("sde_type", ["sde", "cps"])
def test_mean_std_and_log_prob_match_float64_formulas(scheduler, sde_type):
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(4, 16, 8, generator=g)
    v = torch.randn(4, 16, 8, generator=g)
    idx = torch.tensor([0, 3, 5, NUM_STEPS - 1])  # σ = 1 first step and the last step included
    a = [0.7, 1.2, 0.3, 0.9]
    prev = torch.randn(4, 16, 8, generator=g)

    out = sde_step_with_logprob(
        scheduler, v, scheduler.timesteps[idx], x, torch.tensor(a), prev_sample=prev, sde_type=sde_type
    )

    mean, scale = reference_mean_and_scale(scheduler, idx, x, v, a, sde_type)
    torch.testing.assert_close(out.prev_sample_mean.double(), mean, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.prev_sample, prev)
    if sde_type == "sde":
        want = torch.distributions.Normal(mean, scale.view(-1, 1, 1)).log_prob(prev.double()).mean(dim=(1, 2))
        assert scheduler.sigmas[0] == 1.0  # the σ = 1 branch was exercised
    else:
        want = -((prev.double() - mean) ** 2).mean(dim=(1, 2))
    torch.testing.assert_close(out.log_prob.double(), want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("sde_type", ["sde", "cps"])
def test_sampled_prev_sample_has_the_formula_mean_and_variance(scheduler, sde_type):
    x = torch.randn(2, 256, 64, generator=torch.Generator().manual_seed(0))
    v = torch.randn(2, 256, 64, generator=torch.Generator().manual_seed(1))
    idx = torch.tensor([2, 6])
    gens = [torch.Generator().manual_seed(10), torch.Generator().manual_seed(11)]

    out = sde_step_with_logprob(scheduler, v, scheduler.timesteps[idx], x, 1.0, generator=gens, sde_type=sde_type)

    _, scale = reference_mean_and_scale(scheduler, idx, x, v, [1.0, 1.0], sde_type)
    resid = (out.prev_sample - out.prev_sample_mean).double().reshape(2, -1)
    n = resid.shape[1]  # 16384 draws per sample: mean and variance are known to ~1% here
    for b in range(2):
        assert abs(resid[b].mean().item()) < 5 * scale[b].item() / math.sqrt(n)
        assert resid[b].var().item() / scale[b].item() ** 2 == pytest.approx(1.0, abs=5 * math.sqrt(2 / n))


def test_zero_noise_is_the_euler_step_and_has_no_log_prob(scheduler):
    x, v = torch.randn(2, 8, 4), torch.randn(2, 8, 4)
    t = scheduler.timesteps[3]
    out = sde_step_with_logprob(scheduler, v, t, x, noise_level=torch.tensor([0.0, 0.7]))

    euler = FlowMatchEulerDiscreteScheduler(**QWEN_IMAGE_SCHEDULER_CONFIG)
    euler.set_timesteps(NUM_STEPS, mu=0.8)
    euler.set_begin_index(3)
    want = euler.step(v[:1], t, x[:1]).prev_sample
    torch.testing.assert_close(out.prev_sample[:1], want)
    assert torch.isnan(out.log_prob[0]) and torch.isfinite(out.log_prob[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ode_step_is_the_sde_step_at_noise_level_zero_bit_for_bit(scheduler, dtype):
    # the rollout takes ode_step outside the SDE window: what it computes there must not change
    x, v = torch.randn(3, 8, 4).to(dtype), torch.randn(3, 8, 4).to(dtype)
    dts = step_dts(schedule_sigmas(scheduler))
    assert len(dts) == NUM_STEPS
    for i in (0, 4, NUM_STEPS - 1):
        sde = sde_step_with_logprob(scheduler, v, scheduler.timesteps[i], x, noise_level=0.0).prev_sample
        assert torch.equal(ode_step(x, v, dts[i]), sde)
    cps = sde_step_with_logprob(scheduler, v, scheduler.timesteps[4], x, noise_level=0.0, sde_type="cps")
    torch.testing.assert_close(ode_step(x, v, dts[4]), cps.prev_sample)


@pytest.mark.parametrize("sde_type", ["sde", "cps"])
def test_transition_at_a_known_step_is_the_step_by_timestep_bit_for_bit(scheduler, sde_type):
    # the rollout steps with sde_transition at the loop's step index (no lookup); the trainer replays
    # the same transition through sde_step_with_logprob's timestep lookup: both must agree exactly
    g = torch.Generator().manual_seed(7)
    x, v = (torch.randn(3, 8, 4, generator=g) for _ in range(2))
    levels = torch.tensor([0.7, 0.0, 1.2])
    sigmas = schedule_sigmas(scheduler)

    def generators():
        return [torch.Generator().manual_seed(100 + b) for b in range(3)]

    for i in (0, 5, NUM_STEPS - 1):
        by_timestep = sde_step_with_logprob(
            scheduler, v, scheduler.timesteps[i], x, levels, generator=generators(), sde_type=sde_type
        )
        at_step = sde_transition(v, x, sigmas, i, levels, generator=generators(), sde_type=sde_type)
        for got, want in zip(at_step, by_timestep, strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
        assert torch.isnan(at_step.log_prob[1]) and torch.isfinite(at_step.log_prob[[0, 2]]).all()


def test_per_sample_generators_make_a_sample_independent_of_its_batch(scheduler):
    x, v = torch.randn(2, 8, 4), torch.randn(2, 8, 4)
    t = scheduler.timesteps[1]
    both = sde_step_with_logprob(
        scheduler, v, t, x, generator=[torch.Generator().manual_seed(5), torch.Generator().manual_seed(6)]
    )
    alone = sde_step_with_logprob(scheduler, v[1:], t, x[1:], generator=[torch.Generator().manual_seed(6)])
    torch.testing.assert_close(both.prev_sample[1:], alone.prev_sample)
    torch.testing.assert_close(both.log_prob[1:], alone.log_prob)


def test_scheduler_method_loads_the_qwen_image_config(tmp_path):
    FlowMatchEulerDiscreteScheduler(**QWEN_IMAGE_SCHEDULER_CONFIG).save_pretrained(tmp_path)
    sched = FlowMatchSDEDiscreteScheduler.from_pretrained(tmp_path)
    sched.set_timesteps(4, mu=0.5)
    x = torch.randn(1, 4, 4)
    out = sched.step_with_logprob(x, sched.timesteps[0], x, generator=torch.Generator().manual_seed(0))
    assert out.prev_sample.dtype == torch.float32 and torch.isfinite(out.log_prob).all()


def test_inputs_in_low_precision_are_upcast(scheduler):
    x, v = torch.randn(2, 8, 4), torch.randn(2, 8, 4)
    t = scheduler.timesteps[2]
    full = sde_step_with_logprob(scheduler, v, t, x, generator=torch.Generator().manual_seed(3))
    half = sde_step_with_logprob(scheduler, v.bfloat16(), t, x.bfloat16(), prev_sample=full.prev_sample)
    assert half.log_prob.dtype == torch.float32 and half.prev_sample_mean.dtype == torch.float32


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"sde_type": "ode"}, "sde_type"),
        ({"noise_level": -0.1}, "noise_level"),
        ({"noise_level": torch.tensor([0.5, 0.5, 0.5])}, "noise_level"),
        ({"timestep": 123.456}, "timestep"),
    ],
)
def test_bad_arguments_raise_naming_them(scheduler, kwargs, match):
    x = torch.randn(2, 8, 4)
    args = {"timestep": scheduler.timesteps[0], **kwargs}
    with pytest.raises(ValueError, match=match):
        sde_step_with_logprob(scheduler, x, args.pop("timestep"), x, **args)


def test_window_start_is_deterministic_per_seed_and_spreads_over_seeds():
    starts = [sample_sde_window_start(seed, 10, 2, (0, 5)) for seed in range(50)]
    assert starts == [sample_sde_window_start(seed, 10, 2, (0, 5)) for seed in range(50)]
    assert set(starts) == {0, 1, 2, 3}  # every admissible start [0, 5 - 2] appears, nothing else


def test_window_noise_levels_cover_exactly_the_window():
    levels = window_noise_levels(10, 3, 2, 1.2)
    assert levels == [0.0, 0.0, 0.0, 1.2, 1.2, 0.0, 0.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    "num_steps, size, window_range, match",
    [
        (10, 2, (0, 11), "window_range"),
        (10, 2, (4, 5), "shorter"),
        (10, 0, (0, 5), "window_size"),
        (10, 2, (-1, 5), "window_range"),
    ],
)
def test_window_outside_the_step_range_raises(num_steps, size, window_range, match):
    with pytest.raises(ValueError, match=match):
        sample_sde_window_start(0, num_steps, size, window_range)
    with pytest.raises(ValueError, match="outside"):
        window_noise_levels(10, 9, 2, 1.0)

"""DanceGRPO's SDE step (``sde_type="dance"``) against its formula written out again in float64.

The module computes the mean in closed form, x·(1 + a²Δt/(2σ)) + v·Δt·(1 + a²(1 − σ)/(2σ)); the test
writes it as the authors' code does, in float64: x̂0 = x − σv, score = −(x − (1 − σ)x̂0)/σ²,
μ = x + Δt·v − ½a²·score·Δt, std = a·sqrt(−Δt). The two agree only if the algebra is right.
"""

import math

import pytest
import torch

from verl_omni.pipelines.qwen_image.tiny_model import QWEN_IMAGE_SCHEDULER_CONFIG
from verl_omni.pipelines.sampling import SamplingSpec
from verl_omni.pipelines.schedulers import FlowMatchSDEDiscreteScheduler, sde_step_with_logprob, sde_transition

NUM_STEPS = 10


@pytest.fixture(scope="module")
def scheduler():
    sched = FlowMatchSDEDiscreteScheduler(**QWEN_IMAGE_SCHEDULER_CONFIG)
    sched.set_timesteps(NUM_STEPS, mu=0.8)
    return sched


def dance_reference(sigma: float, sigma_next: float, x, v, a: float):
    """(mean, std) of DanceGRPO's transition in float64, in the authors' score form."""
    dt = sigma_next - sigma
    x, v = x.double(), v.double()
    x0_hat = x - sigma * v
    score = -(x - (1 - sigma) * x0_hat) / sigma**2
    mean = x + dt * v - 0.5 * a**2 * score * dt
    return mean, a * math.sqrt(-dt)


def test_mean_std_and_log_prob_match_the_closed_form_on_the_first_middle_and_last_step(scheduler):
    g = torch.Generator().manual_seed(7)
    x, v, prev = (torch.randn(4, 16, 8, generator=g) for _ in range(3))
    idx = torch.tensor([0, 4, 7, NUM_STEPS - 1])  # σ = 1 first, σ' = 0 last
    a = [0.3, 0.7, 1.0, 1.4]
    assert scheduler.sigmas[0] == 1.0 and scheduler.sigmas[-1] == 0.0

    out = sde_step_with_logprob(
        scheduler, v, scheduler.timesteps[idx], x, torch.tensor(a), prev_sample=prev, sde_type="dance"
    )

    sig = scheduler.sigmas.double()
    for b in range(4):
        mean, std = dance_reference(sig[idx[b]].item(), sig[idx[b] + 1].item(), x[b], v[b], a[b])
        torch.testing.assert_close(out.prev_sample_mean[b].double(), mean, rtol=1e-5, atol=1e-5)
        want = (-((prev[b].double() - mean) ** 2) / (2 * std**2) - math.log(std) - 0.5 * math.log(2 * math.pi)).mean()
        torch.testing.assert_close(out.log_prob[b].double(), want, rtol=1e-5, atol=1e-4)
        assert out.std_dev_t[b].item() == pytest.approx(a[b])


def test_sampled_noise_has_the_steps_std(scheduler):
    x = torch.randn(1, 256, 64, generator=torch.Generator().manual_seed(0))
    v = torch.randn(1, 256, 64, generator=torch.Generator().manual_seed(1))
    out = sde_step_with_logprob(
        scheduler, v, scheduler.timesteps[3], x, 0.7, generator=torch.Generator().manual_seed(2), sde_type="dance"
    )
    std = 0.7 * math.sqrt(float(scheduler.sigmas[3] - scheduler.sigmas[4]))
    resid = (out.prev_sample - out.prev_sample_mean).double().flatten()
    n = resid.numel()
    assert abs(resid.mean().item()) < 5 * std / math.sqrt(n)
    assert resid.var().item() / std**2 == pytest.approx(1.0, abs=5 * math.sqrt(2 / n))


def test_noise_level_zero_is_the_euler_step_without_a_log_prob(scheduler):
    x, v = torch.randn(2, 8, 4), torch.randn(2, 8, 4)
    out = sde_step_with_logprob(scheduler, v, scheduler.timesteps[2], x, torch.tensor([0.0, 0.5]), sde_type="dance")
    dt = scheduler.sigmas[3] - scheduler.sigmas[2]
    torch.testing.assert_close(out.prev_sample[0], x[0] + dt * v[0], rtol=0, atol=1e-6)
    assert torch.isnan(out.log_prob[0]) and torch.isfinite(out.log_prob[1])


@pytest.mark.parametrize("sigma", [1e-2, 1e-4])
def test_a_step_from_a_small_sigma_to_zero_stays_finite_and_on_the_formula(sigma):
    # the score divides by σ²; in closed form the 1/σ² cancels against x̂0 (fp32 keeps its digits)
    sigmas = torch.tensor([1.0, 0.5, sigma, 0.0])
    x = torch.randn(3, 6, 4, generator=torch.Generator().manual_seed(3))
    v = torch.randn(3, 6, 4, generator=torch.Generator().manual_seed(4))
    prev = torch.randn(3, 6, 4, generator=torch.Generator().manual_seed(5))
    out = sde_transition(v, x, sigmas, 2, torch.full((3,), 0.8), prev_sample=prev, sde_type="dance")
    mean, _ = dance_reference(sigma, 0.0, x, v, 0.8)
    assert bool(torch.isfinite(out.log_prob).all()) and bool(torch.isfinite(out.prev_sample_mean).all())
    torch.testing.assert_close(out.prev_sample_mean.double(), mean, rtol=1e-5, atol=1e-5)


def test_the_spec_accepts_dance_with_its_noise_bound():
    assert SamplingSpec(sde_type="dance", noise_level=0.3).sde_type == "dance"
    with pytest.raises(ValueError, match=r"noise_level must be in \[0, 1.414\] for sde_type='dance'"):
        SamplingSpec(sde_type="dance", noise_level=1.5)

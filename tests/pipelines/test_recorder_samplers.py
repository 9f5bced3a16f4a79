"""The recorder with DanceGRPO's and MixGRPO's sampling: shared initial noise, the progressive window, the Flash
ODE after it (and after the window range's end with random windows), and the replay of what it recorded (the trainer's log-prob equals the rollout's)."""

import pytest
import torch

from verl_omni.agent_loop.utils import group_noise_seeds
from verl_omni.pipelines.recorder import RolloutRecorder
from verl_omni.pipelines.rollout_request import RolloutRequest
from verl_omni.pipelines.sampling import SamplingSpec
from verl_omni.pipelines.schedulers.flow_match_sde import FlowMatchSDEDiscreteScheduler, ode_step, schedule_sigmas
from verl_omni.pipelines.schedulers.mix_ode import (
    dpm_solver_pp_step,
    post_window_indices,
    progressive_window_start,
)
from verl_omni.workers.utils.replay import replay_step

STEPS = 8
LATENT = (5, 8)


def spec(seeds, **kwargs) -> SamplingSpec:
    return SamplingSpec(num_inference_steps=STEPS, seeds=seeds, **kwargs)


def scheduler():
    sched = FlowMatchSDEDiscreteScheduler(shift=3.0)
    sched.set_timesteps(STEPS)
    return sched


def velocity(x: torch.Tensor) -> torch.Tensor:
    """A per-sample model stand-in (each sample's velocity depends on that sample only)."""
    return torch.tanh(x) - 0.3 * x


def denoise(requests, steps_taken: list | None = None):
    """Run the recorder as a pipeline does, looping over ``recorder.loop_timesteps``."""
    recorder = RolloutRecorder(requests, torch.device("cpu"))
    latents = torch.cat([torch.randn(1, *LATENT, generator=g) for g in recorder.generators])
    sched = scheduler()
    recorder.set_schedule(schedule_sigmas(sched), sched.timesteps)
    for _ in recorder.loop_timesteps:
        before = latents
        latents = recorder.step(velocity(latents), latents)
        if steps_taken is not None:
            steps_taken.append((before, latents))
    return latents, recorder


def test_shared_initial_noise_starts_a_group_from_one_latent_and_keeps_its_sde_noise_per_sample():
    seeds = [11, 12, 13]
    shared = RolloutRequest.build([1], None, spec(seeds, sde_type="dance", initial_noise_seeds=[11, 11, 11]))
    own = RolloutRequest.build([1], None, spec(seeds, sde_type="dance"))
    taken_shared, taken_own = [], []
    denoise([shared], taken_shared)
    denoise([own], taken_own)
    start = taken_shared[0][0]
    assert torch.equal(start[0], start[1]) and torch.equal(start[0], start[2])
    assert torch.equal(start[0], taken_own[0][0][0])  # the group's noise is its first sample's
    first_window_step = shared.window_starts[0]
    after = taken_shared[first_window_step][1]
    assert not torch.equal(after[0], after[1])  # one start, three SDE paths
    assert not torch.equal(taken_own[0][0][1], start[1])


def test_group_noise_seeds_are_per_uid_else_per_run_of_the_group_size():
    rows = [{"uid": "a"}, {"uid": "a"}, {"uid": "b"}, {"uid": "b"}, {"uid": "a"}]
    assert group_noise_seeds(rows, [1, 2, 3, 4, 5], 2) == [1, 1, 3, 3, 1]
    assert group_noise_seeds([{}, {}, {}, {}], [1, 2, 3, 4], 2) == [1, 1, 3, 3]


def test_progressive_windows_are_one_window_for_every_sample_at_the_trainers_step():
    for step in (1, 3, 7):
        values = {"sde_window_schedule": "progressive", "sde_window_size": 2, "sde_window_shift_every": 2}
        request = RolloutRequest.build([1], None, spec([4, 5, 6], global_step=step, **values))
        assert request.window_starts == [progressive_window_start(step, 2, (0, STEPS), 1, 2)] * 3
        _, recorder = denoise([request])
        (trajectory,) = recorder.split()
        assert trajectory["window_start"].tolist() == request.window_starts


def flash_request(step: int, ratio: float, solver: str = "dpmsolver++", seeds=(4, 5)) -> RolloutRequest:
    values = {
        "sde_window_schedule": "progressive",
        "sde_window_size": 2,
        "sde_window_shift_every": 1,
        "ode_solver": solver,
        "ode_post_window_ratio": ratio,
        "global_step": step,
    }
    return RolloutRequest.build([1], None, spec(list(seeds), **values))


@pytest.mark.parametrize("step", [1, 3, 7])  # window [0, 2), [2, 4), [6, 8): at the start, inside, at the end
def test_flash_records_the_same_window_with_fewer_model_calls_and_dpm_solver_after_it(step):
    flash, plain = flash_request(step, 0.5), flash_request(step, 1.0, solver="euler")
    taken_flash, taken_plain = [], []
    _, rec_flash = denoise([flash], taken_flash)
    _, rec_plain = denoise([plain], taken_plain)
    end = flash.window_starts[0] + 2
    kept = list(range(end)) + post_window_indices(STEPS, end, 0.5)
    assert len(taken_flash) == len(kept) - 1 < STEPS or end == STEPS
    sched = scheduler()
    assert rec_flash.loop_timesteps.tolist() == sched.timesteps[kept[:-1]].tolist()
    # up to the window's end the rollout is the plain one, bit for bit; so is what it records
    for k in range(end):
        assert torch.equal(taken_flash[k][1], taken_plain[k][1])
    for key, value in rec_plain.split()[0].items():
        assert torch.equal(rec_flash.split()[0][key], value), key
    # after it: DPM-Solver++ on the thinned σ, fed the data prediction of the step before
    sigmas = schedule_sigmas(sched)[kept].tolist()
    for k in range(end, len(taken_flash)):
        before, after = taken_flash[k]
        prev_before = taken_flash[k - 1][0]
        x0 = before - sigmas[k] * velocity(before)
        x0_prev = prev_before - sigmas[k - 1] * velocity(prev_before)
        assert torch.equal(after, dpm_solver_pp_step(before, x0, sigmas, k, x0_prev, 2))


def test_a_loop_over_the_unthinned_timesteps_is_stopped_with_the_reason():
    recorder = RolloutRecorder([flash_request(1, 0.5)], torch.device("cpu"))
    sched = scheduler()
    recorder.set_schedule(schedule_sigmas(sched), sched.timesteps)
    latents = torch.randn(2, *LATENT)
    with pytest.raises(RuntimeError, match="recorder.loop_timesteps"):
        for _ in sched.timesteps:
            latents = recorder.step(velocity(latents), latents)


R1 = 5  # the window range's end: random windows of 2 start in [0, 3], so steps 5..7 are after every window


def thinned_random_request(ratio: float, solver: str = "dpmsolver++", r1: int = R1) -> RolloutRequest:
    values = {"sde_window_size": 2, "sde_window_range": (0, r1), "ode_solver": solver, "ode_post_window_ratio": ratio}
    return RolloutRequest.build([1], None, spec([3, 4, 7], **values))


@pytest.mark.parametrize("solver", ["euler", "dpmsolver++"])
def test_random_windows_thin_only_the_steps_after_the_window_range_and_record_the_same_windows(solver):
    thinned, plain = thinned_random_request(0.5, solver), thinned_random_request(1.0, "euler")
    assert sorted(set(thinned.window_starts)) == [2, 3]  # the samples' windows end at different steps
    taken_thin, taken_plain = [], []
    final_thin, rec_thin = denoise([thinned], taken_thin)
    final_plain, rec_plain = denoise([plain], taken_plain)
    kept = list(range(R1)) + post_window_indices(STEPS, R1, 0.5)
    assert len(taken_thin) == len(kept) - 1 == 6 and len(taken_plain) == STEPS
    assert rec_thin.loop_timesteps.tolist() == scheduler().timesteps[kept[:-1]].tolist()
    # every step a window may cover is the unthinned run's, bit for bit; so is everything recorded
    for k in range(R1):
        assert torch.equal(taken_thin[k][1], taken_plain[k][1]), k
    recorded = rec_thin.split()[0]
    for key, value in rec_plain.split()[0].items():
        assert torch.equal(recorded[key], value), key
    assert not torch.equal(final_thin, final_plain)  # the image comes from the cheaper ODE


def test_random_windows_of_other_window_ranges_cannot_share_a_thinned_batch():
    with pytest.raises(ValueError, match=r"needs one window end for the whole batch, got \[4, 5\]"):
        denoise([thinned_random_request(0.5), thinned_random_request(0.5, r1=4)])


def test_steps_outside_the_window_of_a_dance_rollout_are_the_exact_euler_step():
    request = RolloutRequest.build([1], None, spec([3, 9], sde_type="dance", sde_window_size=3))
    taken = []
    _, recorder = denoise([request], taken)
    sigmas = schedule_sigmas(scheduler())
    for k, (before, after) in enumerate(taken):
        euler = ode_step(before, velocity(before), float(sigmas[k + 1] - sigmas[k]))
        for i in range(2):
            assert torch.equal(after[i], euler[i]) == (i not in recorder.in_window(k)), (i, k)


class _StandInAdapter:
    """The replay's model side for the stand-in velocity: what a training adapter's ``step_velocity`` does."""

    @staticmethod
    def step_velocity(transformer, batch, step, spec, vae_scale_factor):
        return velocity(batch["all_latents"][:, step])


@pytest.mark.parametrize(
    "values",
    [
        {"sde_type": "dance", "sde_window_size": STEPS, "noise_level": 0.3, "initial_noise_seeds": [8, 8]},
        {"sde_type": "sde", "sde_window_schedule": "progressive", "global_step": 4, "ode_solver": "dpmsolver++"},
        {"sde_type": "dance", "sde_window_schedule": "progressive", "global_step": 9, "ode_post_window_ratio": 0.4},
        {"sde_window_range": (0, R1), "ode_solver": "dpmsolver++", "ode_post_window_ratio": 0.5},
    ],
    ids=["dance_all_steps", "mix_grpo_flash", "dance_window_thinned", "random_windows_thinned_after_r1"],
)
def test_the_replay_of_every_recorded_step_gives_the_rollouts_log_prob(values):
    request = RolloutRequest.build([1], None, spec([8, 9], **values))
    _, recorder = denoise([request])
    (trajectory,) = recorder.split()
    sched = scheduler()
    replay_spec = request.spec.replay()
    window = trajectory["rollout_log_probs"].shape[1]
    assert window == request.spec.sde_window_size
    for j in range(window):
        out = replay_step(_StandInAdapter, None, sched, trajectory, j, replay_spec)
        assert torch.equal(out.log_prob, trajectory["rollout_log_probs"][:, j]), j

"""The shared rollout recorder: seeded windows, exact ODE steps, per-request split, no host sync while stepping."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from verl_omni.pipelines.recorder import RECORDED_KEYS, RolloutRecorder
from verl_omni.pipelines.rollout_request import RolloutRequest
from verl_omni.pipelines.sampling import SamplingSpec
from verl_omni.pipelines.schedulers.flow_match_sde import (
    FlowMatchSDEDiscreteScheduler,
    ode_step,
    sample_sde_window_start,
    schedule_sigmas,
)

STEPS = 6
LATENT = (5, 8)


def request(seeds, noise_level=0.7, window=2, window_range=None, sde_type="sde"):
    spec = SamplingSpec(
        num_inference_steps=STEPS,
        noise_level=noise_level,
        sde_window_size=window,
        sde_window_range=window_range,
        sde_type=sde_type,
        seeds=seeds,
    )
    return RolloutRequest.build([1, 2], None, spec)


def schedule():
    scheduler = FlowMatchSDEDiscreteScheduler(shift=3.0)
    scheduler.set_timesteps(STEPS)
    return schedule_sigmas(scheduler), scheduler.timesteps


def velocity(x: torch.Tensor) -> torch.Tensor:
    """A per-sample model stand-in: each sample's velocity depends on that sample only."""
    return torch.tanh(x) - 0.3 * x


def denoise(requests, record_steps: list | None = None):
    """Run the recorder over ``requests`` as a pipeline does; returns (final latents, recorder)."""
    recorder = RolloutRecorder(requests, torch.device("cpu"))
    latents = torch.cat([torch.randn(1, *LATENT, generator=g) for g in recorder.generators])
    recorder.set_schedule(*schedule())
    for _ in range(STEPS):
        before = latents
        latents = recorder.step(velocity(latents), latents)
        if record_steps is not None:
            record_steps.append((before, latents))
    return latents, recorder


def test_each_sample_records_its_seeded_window_and_nothing_else():
    seeds = [3, 11, 42, 7]
    (trajectory,) = denoise([request(seeds, window_range=[1, 5])])[1].split()
    _, timesteps = schedule()
    starts = [sample_sde_window_start(s, STEPS, 2, (1, 5)) for s in seeds]
    assert set(trajectory) == set(RECORDED_KEYS)
    assert trajectory["window_start"].tolist() == starts
    assert all(1 <= s <= 3 for s in starts)
    assert trajectory["all_latents"].shape == (4, 3, *LATENT)
    assert trajectory["rollout_log_probs"].shape == (4, 2) and bool(
        torch.isfinite(trajectory["rollout_log_probs"]).all()
    )
    for i, start in enumerate(starts):
        torch.testing.assert_close(trajectory["all_timesteps"][i], timesteps[start : start + 2], rtol=0, atol=0)


@pytest.mark.parametrize("sde_type", ["sde", "cps"])
def test_steps_outside_a_samples_window_are_the_exact_euler_step(sde_type):
    steps = []
    _, recorder = denoise([request([3, 11, 42, 7], sde_type=sde_type)], steps)
    sigmas, _ = schedule()
    for k, (before, after) in enumerate(steps):
        dt = float(sigmas[k + 1] - sigmas[k])
        euler = ode_step(before, velocity(before), dt)
        for i in range(4):
            if i not in recorder.in_window(k):
                assert torch.equal(after[i], euler[i]), f"sample {i} step {k}"
            else:
                assert not torch.equal(after[i], euler[i]), f"sample {i} step {k} is inside its window"


def test_a_sample_is_the_same_alone_or_batched_and_split_per_request_in_order():
    first, second = request([5, 6]), request([9])
    ode = request([12], noise_level=0.0)
    batched_latents, batched = denoise([first, second, ode])
    split = batched.split()
    assert [t["all_latents"].shape[0] for t in split] == [2, 1, 1]
    assert split[2]["all_latents"].shape == (1, 0, *LATENT) and split[2]["rollout_log_probs"].shape == (1, 0)
    for position, req in enumerate([first, second, ode]):
        alone_latents, alone = denoise([req])
        (trajectory,) = alone.split()
        rows = batched.rows()[position]
        assert torch.equal(batched_latents[rows.start : rows.stop], alone_latents)
        for key in RECORDED_KEYS:
            assert torch.equal(split[position][key], trajectory[key]), key


def test_one_sample_at_a_time_matches_the_batch():
    from verl_omni.pipelines.recorder import concat_trajectories

    req = request([21, 22, 23])
    _, batched = denoise([req])
    parts = [denoise([req.sample(i)])[1].split()[0] for i in range(3)]
    (whole,) = batched.split()
    for key, value in concat_trajectories(parts).items():
        assert torch.equal(value, whole[key]), key


class _HostReads(TorchDispatchMode):
    """Counts reads of a tensor's value by the host (``.item()``, ``float()``, ``bool()`` all dispatch here)."""

    def __init__(self):
        super().__init__()
        self.reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.reads += 1
        return func(*args, **(kwargs or {}))


def test_stepping_reads_nothing_back_to_the_host():
    recorder = RolloutRecorder([request([1, 2, 3], window=3)], torch.device("cpu"))
    latents = torch.cat([torch.randn(1, *LATENT, generator=g) for g in recorder.generators])
    recorder.set_schedule(*schedule())
    with _HostReads() as mode:
        for _ in range(STEPS):
            latents = recorder.step(velocity(latents), latents)
    assert mode.reads == 0
    # the check itself can fail: a host read in the loop is seen
    with _HostReads() as mode:
        float(latents.sum())
    assert mode.reads == 1


def test_misuse_is_refused_with_the_reason():
    recorder = RolloutRecorder([request([1], window=STEPS)], torch.device("cpu"))
    with pytest.raises(RuntimeError, match="set_schedule"):
        recorder.step(torch.zeros(1, *LATENT), torch.zeros(1, *LATENT))
    sigmas, timesteps = schedule()
    with pytest.raises(ValueError, match="timesteps"):
        recorder.set_schedule(sigmas, timesteps[:-1])
    with pytest.raises(ValueError, match="end after"):
        recorder.set_schedule(sigmas[:3], timesteps[:2])
    recorder.set_schedule(sigmas, timesteps)
    with pytest.raises(ValueError, match="samples"):
        recorder.step(torch.zeros(2, *LATENT), torch.zeros(2, *LATENT))
    with pytest.raises(ValueError, match="sde_type"):
        RolloutRecorder([request([1]), request([2], sde_type="cps")], torch.device("cpu"))


class _StockLoop:
    """vLLM-Omni's own stepping (SD3 / FLUX: ``scheduler_step_maybe_with_cfg`` → ``self.scheduler.step``), on the
    real mixin, with the schedule set the stock way."""

    def __init__(self):
        from vllm_omni.diffusion.distributed.cfg_parallel import CFGParallelMixin

        class Pipeline(CFGParallelMixin):
            pass

        self.pipeline = Pipeline()
        self.pipeline.scheduler = FlowMatchSDEDiscreteScheduler(shift=3.0)
        self.pipeline.scheduler.set_timesteps(STEPS)

    def run(self, latents: torch.Tensor) -> torch.Tensor:
        for t in self.pipeline.scheduler.timesteps:
            latents = self.pipeline.scheduler_step_maybe_with_cfg(velocity(latents), t, latents, False)
        return latents


def test_a_stock_loop_records_through_the_recording_scheduler_as_the_recorder_itself_would():
    reqs = [request([3, 11]), request([42], sde_type="sde")]
    direct_latents, direct = denoise(reqs)
    stock = _StockLoop()
    original = stock.pipeline.scheduler
    recorder = RolloutRecorder(reqs, torch.device("cpu"))
    latents = torch.cat([torch.randn(1, *LATENT, generator=g) for g in recorder.generators])
    with recorder.recording(stock.pipeline):
        assert stock.pipeline.scheduler.timesteps is original.timesteps  # everything but step is the scheduler's
        latents = stock.run(latents)
    assert stock.pipeline.scheduler is original
    assert torch.equal(latents, direct_latents)
    for mine, theirs in zip(recorder.split(), direct.split(), strict=True):
        for key in RECORDED_KEYS:
            assert torch.equal(mine[key], theirs[key]), key


def test_an_ode_request_records_its_clean_final_latents_and_an_sde_request_does_not():
    from verl_omni.pipelines.recorder import CLEAN_LATENTS_KEY

    sde, ode = request([5, 6]), request([12, 13], noise_level=0.0)
    final, recorder = denoise([sde, ode])
    sde_out, ode_out = recorder.split()
    assert CLEAN_LATENTS_KEY not in sde_out
    # the ODE samples' latents after the last step, fp32, in the latents' layout
    torch.testing.assert_close(ode_out[CLEAN_LATENTS_KEY], final[2:4].float(), rtol=0, atol=0)
    assert ode_out[CLEAN_LATENTS_KEY].shape == (2, *LATENT)
    # an all-ODE batch steps without a window and records them too
    alone_final, alone = denoise([ode])
    torch.testing.assert_close(alone.split()[0][CLEAN_LATENTS_KEY], alone_final, rtol=0, atol=0)

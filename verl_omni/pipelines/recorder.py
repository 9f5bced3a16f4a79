"""The model-neutral rollout recorder: per-sample seeds, SDE windows, the step, and the recorded trajectory.

Every rollout pipeline (Qwen-Image, BAGEL, and a new model's) samples with it, so that what makes
Flow-GRPO correct lives in one place: each sample has its own seed and generator (its noise and
its window do not depend on what shares its transformer batch); a sample's W stochastic steps
start at a seeded index in ``[r0, r1 − W]``; every other step is the exact Euler (ODE) step; the
recorder keeps, per sample, the W+1 latents, W log-probs and W timesteps of its window, and hands
them out split per request. Stepping never reads a value back to the host: the σ table, the noise
levels and the window masks are on the latents' device, and which sample is inside its window at
which step is known on the host from the seeds alone.

A pipeline that writes its own loop uses it in four calls::

    recorder = RolloutRecorder(requests, device)              # seeds, generators, windows
    latents = self.prepare_latents(..., recorder.generators)  # per-sample initial noise
    recorder.set_schedule(schedule_sigmas(scheduler, device), timesteps)
    for t in recorder.loop_timesteps:                         # the model's own loop and CFG
        latents = recorder.step(noise_pred, latents)
    trajectories = recorder.split()                           # one dict per request, on the host

``recorder.loop_timesteps`` is ``timesteps`` itself unless the spec thins the ODE after the window
(``SamplingSpec.changes_post_window_ode``: MixGRPO-Flash after its shared window, or, with random windows,
after the window range's end r1, ``SamplingSpec.post_window_start``): then it is the compressed schedule,
and a pipeline that loops over its own timesteps instead is stopped at the first step past it. The steps
before that point are the unthinned run's, so the recorded windows and log-probs do not change. With
``initial_noise_seeds`` (DanceGRPO's shared initial noise) ``recorder.generators`` seed the initial
noise only; the SDE noise comes from generators seeded with the samples' own seeds.

A pipeline that keeps vLLM-Omni's own loop (SD3 and FLUX step through
``scheduler_step_maybe_with_cfg`` → ``self.scheduler.step(...)``, Z-Image through
``self.scheduler.step(...)``) runs it inside ``with recorder.recording(self):``, which puts a
:class:`RecordingScheduler` in front of ``self.scheduler`` for the call: its ``step`` is the
recorder's, the schedule is read from the real scheduler at the first step, and everything else
(``set_timesteps``, ``sigmas``, ...) is the real scheduler's.

The recorded tensors carry the names the trainer's batch and the loss use (one name end to
end): ``all_latents`` ``[N, W+1, ...]``, ``rollout_log_probs`` ``[N, W]``, ``all_timesteps``
``[N, W]`` and ``window_start`` ``[N]``. A request sampled with the ODE (noise level 0, the
``ode_samples`` record of ``model_base.ROLLOUT_RECORDS``) records no window but its clean final
latents ``clean_latents`` ``[N, ...]``, what a forward-process algorithm (DiffusionNFT) trains on.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from diffusers.schedulers.scheduling_flow_match_euler_discrete import FlowMatchEulerDiscreteSchedulerOutput
from diffusers.utils.torch_utils import randn_tensor

from verl_omni.pipelines.rollout_request import RolloutRequest
from verl_omni.pipelines.schedulers.flow_match_sde import ode_step, schedule_sigmas, sde_transition, step_dts
from verl_omni.pipelines.schedulers.mix_ode import compressed_schedule, dpm_solver_pp_step

logger = logging.getLogger(__name__)

# the recorded tensors of one request, by their one name from the pipeline to the loss
RECORDED_KEYS = ("all_latents", "rollout_log_probs", "all_timesteps", "window_start")
# the recorded tensors every replayed batch carries (the agent loop stacks them, the replay reads them); the
# model's conditioning tensors come on top (``ModelAdapter.required_keys``)
TRAJECTORY_KEYS = ("all_latents", "all_timesteps")
# the clean final latents of an ODE request (noise level 0), in the layout of ``all_latents``' entries
CLEAN_LATENTS_KEY = "clean_latents"


def shared_row(rows: range) -> slice:
    """The one row of a request's conditioning sent for all its samples.

    A request's N samples share its prompt, so its conditioning (prompt embeddings and masks) is the
    same for all of them; sending it once instead of N times keeps the engine's output transfer from
    growing with N (for SD3.5 at N=16, 16 x [333, 4096] bf16 per prompt and again for the negative).
    ``engine.unpack_request_output`` gives the row to each sample; recorded tensors keep one row per sample.
    """
    return slice(rows.start, rows.start + 1)


class RolloutRecorder:
    """Steps one transformer batch (all samples of ``requests``, request-major) and records its SDE windows.

    Args:
        requests (`Sequence[RolloutRequest]`): the batch's requests, each resolved per sample (seeds, windows).
        device (`torch.device`): where the latents live (the σ table and the recordings stay there).
        generator_device (`torch.device`, *optional*): where the per-sample generators draw; defaults to
            ``device`` (BAGEL draws its initial noise on the CPU).
    """

    def __init__(
        self, requests: Sequence[RolloutRequest], device: torch.device, generator_device: torch.device | None = None
    ):
        if not requests:
            raise ValueError("a rollout recorder needs at least one request")
        self.requests = list(requests)
        self.device = torch.device(device)
        gen_device = self.device if generator_device is None else torch.device(generator_device)
        #: one generator per sample for its window's noise, seeded with the sample's seed
        self._window_generators = [g for r in self.requests for g in r.generators(gen_device)]
        #: one generator per sample for its initial noise: the window's generator (it draws the initial noise
        #: first) unless the request gives the initial noise seeds of its own (``initial_noise_seeds``)
        self.generators = [
            g
            for r, start in zip(self.requests, self._request_offsets(), strict=True)
            for g in (
                r.initial_noise_generators(gen_device)
                if r.spec.initial_noise_seeds
                else self._window_generators[start : start + r.num_samples]
            )
        ]
        sde_types = {r.sde_type for r in self.requests}
        if len(sde_types) > 1:
            raise ValueError(f"requests batched together must share sde_type, got {sorted(sde_types)}")
        self.sde_type = sde_types.pop()
        self.spec = self.requests[0].spec
        for name in ("ode_solver", "ode_solver_order", "ode_post_window_ratio"):
            values = {getattr(r.spec, name) for r in self.requests}
            if len(values) > 1:
                raise ValueError(f"requests batched together must share the sampling spec's {name}, got {values}")
        # per sample (host): window start, window size and noise level; a level of 0 records nothing
        self._starts = [s for r in self.requests for s in r.window_starts]
        self._sizes = [r.window_size for r in self.requests for _ in r.seeds]
        self._levels = [r.noise_level for r in self.requests for _ in r.seeds]
        self.step_index = 0
        self.sigmas: torch.Tensor | None = None
        #: per stochastic step, the whole batch's (x before the step when a window starts there, else None;
        #: x after it; log-probs): kept by reference on the device, each sample's rows gathered at the split
        self._window_steps: dict[int, tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]] = {}
        #: per sample, how many of its window's steps were recorded (host)
        self._recorded = [0] * len(self.generators)
        self._latent_shape: tuple[int, ...] = ()
        self._final: torch.Tensor | None = None

    def _request_offsets(self) -> list[int]:
        offsets, start = [], 0
        for r in self.requests:
            offsets.append(start)
            start += r.num_samples
        return offsets

    @property
    def num_samples(self) -> int:
        return len(self.generators)

    def in_window(self, step: int) -> list[int]:
        """The samples whose SDE window covers ``step`` (host-side, from the seeds alone)."""
        return [
            i
            for i, (start, size, level) in enumerate(zip(self._starts, self._sizes, self._levels, strict=True))
            if level > 0 and start <= step < start + size
        ]

    def set_schedule(self, sigmas: torch.Tensor, timesteps: torch.Tensor) -> None:
        """The schedule: σ ``[T+1]`` (:func:`~verl_omni.pipelines.schedulers.flow_match_sde.schedule_sigmas`)
        and the timesteps ``[T]`` recorded for each window step (the model's own, e.g. 1000σ or σ).

        Reads σ back to the host once (the ODE steps' Δt); nothing is read back while stepping.
        """
        steps = len(sigmas) - 1
        if len(timesteps) != steps:
            raise ValueError(f"{len(timesteps)} timesteps for a schedule of {steps} steps (σ has {len(sigmas)})")
        late = [(i, s) for i, (s, w) in enumerate(zip(self._starts, self._sizes, strict=True)) if s + w > steps]
        if late:
            raise ValueError(f"SDE windows (sample, start) {late} end after the schedule's {steps} steps")
        self.post_window_start = self._post_window_start(steps)
        if self.post_window_start < steps:
            sigmas, timesteps = compressed_schedule(
                sigmas, timesteps, self.post_window_start, self.spec.ode_post_window_ratio
            )
            steps = len(sigmas) - 1
        #: what the pipeline's denoising loop iterates over: ``timesteps`` unless the ODE after the window is thinned
        self.loop_timesteps = timesteps
        self._previous_x0: torch.Tensor | None = None
        self.sigmas = sigmas.to(device=self.device, dtype=torch.float32)
        self.timesteps = timesteps.detach().to(self.device).float()
        self.dts = step_dts(self.sigmas)
        self._sigmas_host = self.sigmas.cpu().tolist()
        per_sample = list(zip(self._starts, self._sizes, self._levels, strict=True))
        table = [[lv if start <= t < start + w else 0.0 for start, w, lv in per_sample] for t in range(steps)]
        # ``[T, B]`` on the device, copied once: a per-step host tensor would be a copy per window step
        self.noise_level_table = torch.tensor(table, dtype=torch.float32).to(self.device)
        self.step_index = 0

    def _post_window_start(self, steps: int) -> int:
        """The first step the spec's changed post-window ODE (MixGRPO-Flash, or thinning after the window range)
        takes: the end of every stochastic request's windows (``SamplingSpec.post_window_start``: the shared
        window's end, or r1 with random windows), which must be one for the batch; ``steps`` (none) when the
        spec keeps the Euler ODE or nothing is stochastic."""
        if not self.spec.changes_post_window_ode:
            return steps
        ends = {r.spec.post_window_start(r.window_starts[0]) for r in self.requests if r.noise_level > 0}
        if not ends:
            return steps
        if len(ends) > 1:
            raise ValueError(
                f"the ODE after the window (ode_solver={self.spec.ode_solver!r}, ode_post_window_ratio="
                f"{self.spec.ode_post_window_ratio}) needs one window end for the whole batch, got {sorted(ends)}"
            )
        return ends.pop()

    # ---- stepping ------------------------------------------------------------------------------

    def step(self, noise_pred: torch.Tensor, latents: torch.Tensor) -> torch.Tensor:
        """One step σ_k → σ_{k+1} of every sample: SDE inside a sample's window (recorded), exact Euler outside.

        Args:
            noise_pred (`torch.Tensor`, ``[B, ...]``): the velocity (after the model's guidance).
            latents (`torch.Tensor`, ``[B, ...]``): x at step k.

        Returns:
            x at step k+1 in ``latents``' dtype.
        """
        if self.sigmas is None:
            raise RuntimeError("RolloutRecorder.step before set_schedule(sigmas, timesteps)")
        if latents.shape[0] != self.num_samples:
            raise ValueError(f"latents hold {latents.shape[0]} samples, the recorder {self.num_samples}")
        step = self.step_index
        if step >= len(self.dts):
            raise RuntimeError(
                f"step {step} is past the recorder's {len(self.dts)}-step schedule: the denoising loop must iterate "
                "over recorder.loop_timesteps (the ODE after the window is thinned by the sampling spec)"
            )
        self.step_index += 1
        self._latent_shape = tuple(latents.shape[1:])
        if self.spec.ode_solver != "euler" and self.post_window_start < len(self.dts):
            return self._solver_step(step, noise_pred, latents)
        return self._step(step, noise_pred, latents)

    def _solver_step(self, step: int, noise_pred: torch.Tensor, latents: torch.Tensor) -> torch.Tensor:
        """A step of a rollout whose ODE after the window is the spec's solver (MixGRPO-Flash): the usual step up to
        the window's end, DPM-Solver++ after it; every step's data prediction x − σv is kept for the next."""
        x0 = latents.to(torch.float32) - self.sigmas[step] * noise_pred.to(torch.float32)
        if step < self.post_window_start:
            out = self._step(step, noise_pred, latents)
        else:
            out = dpm_solver_pp_step(latents, x0, self.sigmas, step, self._previous_x0, self.spec.ode_solver_order).to(
                latents.dtype
            )
        self._previous_x0 = x0
        return out

    def _step(self, step: int, noise_pred: torch.Tensor, latents: torch.Tensor) -> torch.Tensor:
        active = self.in_window(step)
        if not active:
            # nobody in a window: the Euler step, without a noise draw
            return self._keep_final(ode_step(latents, noise_pred, self.dts[step]).to(latents.dtype))
        levels = self.noise_level_table[step]
        result = sde_transition(
            noise_pred,
            latents,
            self.sigmas,
            step,
            levels,
            sde_type=self.sde_type,
            noise=self._window_noise(latents, active),
        )
        prev = result.prev_sample
        if len(active) < self.num_samples:
            # samples outside their window take the exact Euler step whatever the SDE type
            inside = (levels > 0).reshape(-1, *([1] * (latents.ndim - 1)))
            prev = torch.where(inside, prev, ode_step(latents, noise_pred, self.dts[step]))
        # kept on the device until the split, whole-batch (no per-sample copy while stepping): a host copy
        # here would stall the accelerator
        starts_here = any(self._starts[i] == step for i in active)
        before = latents.detach().float() if starts_here else None
        self._window_steps[step] = (before, result.prev_sample.detach(), result.log_prob.detach())
        for i in active:
            self._recorded[i] += 1
        return self._keep_final(prev.to(latents.dtype))

    def _keep_final(self, latents: torch.Tensor) -> torch.Tensor:
        """Keep the clean latents after the schedule's last step (ODE requests record them)."""
        if self.step_index == len(self.dts):
            self._final = latents.detach().float()
        return latents

    def _window_noise(self, latents: torch.Tensor, active: list[int]) -> torch.Tensor:
        """ε of this step, drawn from a sample's generator only inside its own window: a sample's noise
        then does not depend on which samples share its batch (nor on their windows)."""
        shape = (1, *latents.shape[1:])
        draws = torch.cat(
            [
                randn_tensor(shape, generator=self._window_generators[i], device=latents.device, dtype=torch.float32)
                for i in active
            ]
        )
        if len(active) == self.num_samples:
            return draws
        noise = torch.zeros(latents.shape, dtype=torch.float32, device=latents.device)
        for row, i in enumerate(active):
            # row by row: indexing with the list would copy it to the device, a stream sync per step
            noise[i] = draws[row]
        return noise

    @contextmanager
    def recording(self, pipeline: Any, attribute: str = "scheduler") -> Iterator[RolloutRecorder]:
        """Inside the block, ``pipeline.<attribute>.step`` is this recorder's (:class:`RecordingScheduler`);
        the pipeline's own scheduler is put back afterwards, also on errors."""
        original = getattr(pipeline, attribute)
        setattr(pipeline, attribute, RecordingScheduler(original, self))
        try:
            yield self
        finally:
            setattr(pipeline, attribute, original)

    # ---- the recorded trajectories ---------------------------------------------------------------

    def rows(self) -> list[range]:
        """The batch rows of each request, in order."""
        bounds, start = [], 0
        for r in self.requests:
            bounds.append(range(start, start + r.num_samples))
            start += r.num_samples
        return bounds

    def split(self) -> list[dict[str, torch.Tensor]]:
        """Per request, on the host: ``all_latents`` ``[N, W+1, ...]`` (fp32), ``rollout_log_probs`` ``[N, W]``,
        ``all_timesteps`` ``[N, W]``, ``window_start`` ``[N]``; an ODE request (noise level 0) has W = 0 and
        records its clean final latents ``clean_latents`` ``[N, ...]`` (fp32)."""
        return [{k: v.cpu() for k, v in out.items()} for out in self.split_on_device()]

    def split_on_device(self) -> list[dict[str, torch.Tensor]]:
        """:meth:`split` before the host copy: a pipeline that reshapes the recordings (packs the latents) does
        it on the device, then copies once."""
        incomplete = [i for i in range(self.num_samples) if self._recorded[i] not in (0, self._sizes[i])]
        if incomplete:
            raise RuntimeError(f"samples {incomplete} stopped inside their SDE window (step {self.step_index})")
        return [self._request_trajectory(r, rows) for r, rows in zip(self.requests, self.rows(), strict=True)]

    def _request_trajectory(self, request: RolloutRequest, rows: range) -> dict[str, torch.Tensor]:
        n = len(rows)
        if not any(self._recorded[i] for i in rows):
            out = {
                "all_latents": torch.empty(n, 0, *self._latent_shape),
                "rollout_log_probs": torch.empty(n, 0),
                "all_timesteps": torch.empty(n, 0),
            }
            if self._final is not None and request.noise_level == 0:
                out[CLEAN_LATENTS_KEY] = self._final[rows.start : rows.stop]
        else:
            out = self._gather_windows(rows)
        out["window_start"] = torch.tensor(request.window_starts)
        return out

    def _gather_windows(self, rows: range) -> dict[str, torch.Tensor]:
        """Each sample's window rows out of the whole-batch records, in a few gathers (no per-sample copy)."""
        starts = [self._starts[i] for i in rows]
        size = self._sizes[rows.start]
        steps = sorted({s + j for s in starts for j in range(size)})
        first_steps = sorted(set(starts))
        device = self._window_steps[steps[0]][1].device
        # [n, W] positions in ``steps`` of each sample's window; [n] positions in ``first_steps`` of its start
        position = {k: p for p, k in enumerate(steps)}
        window = torch.tensor([[position[s + j] for j in range(size)] for s in starts], device=device)
        first = torch.tensor([first_steps.index(s) for s in starts], device=device)
        sample = torch.arange(len(rows), device=device)
        after = torch.stack([self._window_steps[k][1][rows.start : rows.stop] for k in steps])
        log_probs = torch.stack([self._window_steps[k][2][rows.start : rows.stop] for k in steps])
        before = torch.stack([self._window_steps[k][0][rows.start : rows.stop] for k in first_steps])
        step_ids = torch.tensor([[s + j for j in range(size)] for s in starts], device=self.timesteps.device)
        return {
            "all_latents": torch.cat([before[first, sample][:, None], after[window, sample[:, None]]], dim=1),
            "rollout_log_probs": log_probs[window, sample[:, None]],
            "all_timesteps": self.timesteps[step_ids],
        }


class RecordingScheduler:
    """A pipeline's scheduler whose ``step`` is a :class:`RolloutRecorder`'s (see :meth:`RolloutRecorder.recording`).

    ``step(model_output, timestep, sample, ..., return_dict=True)`` has diffusers' flow-match signature, so a
    stock denoising loop runs unchanged; the recorder takes its schedule from the wrapped scheduler (σ and
    timesteps, as its ``set_timesteps`` left them) at the first step unless it was set already. Every other
    attribute is the wrapped scheduler's.
    """

    def __init__(self, scheduler: Any, recorder: RolloutRecorder):
        self._scheduler = scheduler
        self._recorder = recorder

    def __getattr__(self, name: str) -> Any:
        return getattr(self._scheduler, name)

    def step(self, model_output: torch.Tensor, timestep: Any, sample: torch.Tensor, *args, return_dict=True, **kwargs):
        recorder = self._recorder
        if recorder.sigmas is None:
            recorder.set_schedule(schedule_sigmas(self._scheduler, sample.device), self._scheduler.timesteps)
        prev = recorder.step(model_output, sample)
        return FlowMatchEulerDiscreteSchedulerOutput(prev_sample=prev) if return_dict else (prev,)


def concat_trajectories(parts: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """One request's trajectory from recorders that each stepped some of its samples (BAGEL denoises one
    sample at a time): the recorded tensors concatenated over samples."""
    return {key: torch.cat([p[key] for p in parts]) for key in parts[0]}

from verl_omni.pipelines.schedulers.flow_match_sde import (
    SDE_TYPES,
    FlowMatchSDEDiscreteScheduler,
    SDEStepOutput,
    ode_step,
    sample_sde_window_start,
    schedule_sigmas,
    sde_step_with_logprob,
    sde_transition,
    step_dts,
    window_noise_levels,
)

__all__ = [
    "SDE_TYPES",
    "FlowMatchSDEDiscreteScheduler",
    "SDEStepOutput",
    "ode_step",
    "sample_sde_window_start",
    "schedule_sigmas",
    "sde_step_with_logprob",
    "sde_transition",
    "step_dts",
    "window_noise_levels",
]

from verl_omni.pipelines.schedulers.flow_match_sde import (
    SDE_TYPES,
    FlowMatchSDEDiscreteScheduler,
    SDEStepOutput,
    ode_step,
    sample_sde_window_start,
    sde_step_with_logprob,
    step_dts,
    window_noise_levels,
)

__all__ = [
    "SDE_TYPES",
    "FlowMatchSDEDiscreteScheduler",
    "SDEStepOutput",
    "ode_step",
    "sample_sde_window_start",
    "sde_step_with_logprob",
    "step_dts",
    "window_noise_levels",
]

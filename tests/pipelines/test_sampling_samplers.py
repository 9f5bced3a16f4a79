"""The sampling spec's DanceGRPO / MixGRPO settings: checked once, named in refusals, carried request → replay."""

import pytest

from verl_omni.pipelines.sampling import REQUEST_FIELDS, SamplingSpec
from verl_omni.workers.config.rollout import DiffusionRolloutConfig


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"ode_solver": "dpmsolver++"}, "ode_solver"),
        ({"ode_post_window_ratio": 0.4}, "ode_solver"),
        ({"ode_solver": "heun"}, "ode_solver"),
        ({"ode_solver_order": 3}, "ode_solver_order"),
        ({"ode_post_window_ratio": 0.0, "sde_window_schedule": "progressive"}, "ode_post_window_ratio"),
        ({"sde_window_schedule": "sliding"}, "sde_window_schedule"),
        ({"sde_window_stride": -1}, "sde_window_stride"),
        ({"sde_window_shift_every": 0}, "sde_window_shift_every"),
    ],
)
def test_bad_sampler_settings_are_refused_by_the_spec_under_the_configs_full_key(values, key):
    with pytest.raises(ValueError) as spec_error:
        SamplingSpec(**values)
    with pytest.raises(ValueError) as config_error:
        DiffusionRolloutConfig(**values)
    assert str(spec_error.value).startswith(key)
    assert str(config_error.value) == f"actor_rollout_ref.rollout.{spec_error.value}"


def test_a_changed_post_window_ode_with_random_windows_needs_steps_after_the_window_range_and_says_so():
    with pytest.raises(ValueError, match=r"r1=10 = num_inference_steps leaves no step after it; allowed: sde_window_"):
        SamplingSpec(ode_solver="dpmsolver++")
    with pytest.raises(ValueError, match=r"^ode_solver='euler', ode_post_window_ratio=0.6: .* r1=6"):
        SamplingSpec(num_inference_steps=6, sde_window_range=(0, 6), ode_post_window_ratio=0.6)
    assert SamplingSpec(ode_solver="dpmsolver++", sde_window_schedule="progressive").changes_post_window_ode
    thinned = SamplingSpec(sde_window_range=(0, 5), ode_solver="dpmsolver++", ode_post_window_ratio=0.7)
    assert thinned.changes_post_window_ode


def test_the_post_window_ode_starts_after_the_shared_window_or_after_the_window_range():
    random = SamplingSpec(sde_window_range=(1, 6), ode_post_window_ratio=0.5)
    assert [random.post_window_start(start) for start in (1, 4)] == [6, 6]  # whatever the seed placed
    progressive = SamplingSpec(sde_window_range=(1, 6), sde_window_schedule="progressive")
    assert [progressive.post_window_start(start) for start in (1, 4)] == [3, 6]


def test_initial_noise_seeds_are_one_per_sample():
    with pytest.raises(ValueError, match="initial_noise_seeds has 1 seeds for 2 samples"):
        SamplingSpec(seeds=(1, 2), initial_noise_seeds=(1,))


def test_the_config_mirrors_every_setting_and_the_request_fields_travel_but_are_not_replayed():
    config = DiffusionRolloutConfig(
        sde_type="dance",
        noise_level=0.3,
        same_initial_noise=True,
        sde_window_schedule="progressive",
        sde_window_stride=0,
        sde_window_shift_every=20,
        ode_solver="dpmsolver++",
        ode_solver_order=1,
        ode_post_window_ratio=0.2,
    )
    spec = config.sampling_spec()
    for name in SamplingSpec.__dataclass_fields__:
        if name not in REQUEST_FIELDS:
            assert hasattr(config, name), name
    params = spec.request_params(seeds=[5, 6])
    params |= {"initial_noise_seeds": [5, 5], "global_step": 12}
    request_spec, _ = SamplingSpec.from_request_params(params)
    assert request_spec.global_step == 12 and request_spec.initial_noise_seeds == (5, 5)
    assert request_spec.ode_post_window_ratio == 0.2 and request_spec.sde_window_stride == 0
    replayed = request_spec.replay()
    assert replayed.seeds == () and replayed.initial_noise_seeds == () and replayed.global_step == 0
    assert SamplingSpec.from_dict(replayed.to_dict()) == replayed == spec.replay()

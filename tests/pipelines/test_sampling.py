"""The sampling spec: one validation, refusals that name key, model and allowed values, carried unchanged."""

import dataclasses

import pytest
from verl import DataProto

from verl_omni.pipelines.flux.training_adapter import FluxTrainingAdapter
from verl_omni.pipelines.model_base import MODEL_ADAPTERS
from verl_omni.pipelines.qwen_image.training_adapter import QwenImageTrainingAdapter
from verl_omni.pipelines.rollout_request import parse_rollout_request
from verl_omni.pipelines.sampling import SamplingSpec, shared_spec
from verl_omni.workers.config.rollout import DiffusionRolloutConfig
from verl_omni.workers.engine_workers import _sampling_spec
from verl_omni.workers.rollout.vllm_omni.engine import build_sampling_params

MODEL = "actor_rollout_ref.model.path=/ckpt"


@pytest.mark.parametrize("architecture", MODEL_ADAPTERS.names())
def test_every_models_defaults_resolve_and_its_refusals_name_it(architecture):
    """Switching model is model.path alone: the default config resolves for every registered adapter."""
    adapter = MODEL_ADAPTERS.get(architecture)
    spec = DiffusionRolloutConfig().sampling_spec(adapter=adapter, model=MODEL)
    assert spec.true_cfg_scale == adapter.default_true_cfg_scale
    assert spec.guidance_scale == adapter.default_guidance_scale
    assert spec.window_range[1] == adapter.max_sde_window_end(spec.num_inference_steps)
    with pytest.raises(ValueError, match=rf"height=520: {adapter.__name__} \({MODEL}\).*multiples of"):
        DiffusionRolloutConfig(height=520).sampling_spec(adapter=adapter, model=MODEL)


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"sde_window_size": 0}, "sde_window_size"),
        ({"sde_window_range": (3, 2)}, "sde_window_range"),
        ({"noise_level": -1.0}, "noise_level"),
        ({"sde_type": "ode"}, "sde_type"),
        ({"num_inference_steps": 0}, "num_inference_steps"),
        ({"true_cfg_scale": 0.0}, "true_cfg_scale"),
    ],
)
def test_the_config_refuses_with_the_specs_own_check_under_its_full_key(values, key):
    with pytest.raises(ValueError) as spec_error:
        SamplingSpec(**values)
    with pytest.raises(ValueError) as config_error:
        DiffusionRolloutConfig(**values)
    assert str(spec_error.value).startswith(key)
    assert str(config_error.value) == f"actor_rollout_ref.rollout.{spec_error.value}"


def test_a_size_off_the_models_multiple_names_key_model_and_allowed_values():
    config = DiffusionRolloutConfig(height=520)
    with pytest.raises(ValueError) as error:
        config.sampling_spec(adapter=QwenImageTrainingAdapter, model=MODEL)
    message = str(error.value)
    assert message.startswith("actor_rollout_ref.rollout.height=520")
    assert "QwenImageTrainingAdapter" in message and MODEL in message and "multiples of 16" in message
    assert "512 or 528" in message


def test_true_cfg_on_a_distilled_model_is_refused_and_its_guidance_is_the_default():
    with pytest.raises(ValueError) as error:
        DiffusionRolloutConfig(true_cfg_scale=4.0).sampling_spec(adapter=FluxTrainingAdapter, model=MODEL)
    message = str(error.value)
    assert message.startswith("actor_rollout_ref.rollout.true_cfg_scale=4.0")
    assert "FluxTrainingAdapter" in message and "true_cfg_scale <= 1 or null" in message and "guidance_scale" in message
    spec = DiffusionRolloutConfig().sampling_spec(adapter=FluxTrainingAdapter, model=MODEL)
    assert spec.guidance_scale == 3.5 and not spec.uses_cfg


def test_guidance_embedding_on_a_cfg_model_and_unknown_model_kwargs_are_refused():
    with pytest.raises(ValueError, match=r"rollout\.guidance_scale=3\.0: QwenImageTrainingAdapter.*allowed: null"):
        DiffusionRolloutConfig(guidance_scale=3.0).sampling_spec(adapter=QwenImageTrainingAdapter)
    with pytest.raises(ValueError, match=r"rollout\.model_kwargs has keys \['shift'\].*allowed: \[\]"):
        DiffusionRolloutConfig(model_kwargs={"shift": 3}).sampling_spec(adapter=QwenImageTrainingAdapter)


def test_null_cfg_takes_the_models_default_and_validation_uses_val_noise_level():
    config = DiffusionRolloutConfig(val_noise_level=0.0)
    assert config.sampling_spec(adapter=QwenImageTrainingAdapter).true_cfg_scale == 4.0
    assert config.sampling_spec().true_cfg_scale == 1.0
    assert config.sampling_spec(validate=True).noise_level == 0.0
    with pytest.raises(ValueError, match=r"^actor_rollout_ref\.rollout\.val_noise_level must be in \[0, "):
        DiffusionRolloutConfig(val_noise_level=-0.5)


def test_the_spec_travels_from_the_config_to_the_request_to_the_replay_unchanged():
    config = DiffusionRolloutConfig(
        height=64, width=48, num_inference_steps=6, sde_window_size=3, sde_window_range=[1, 5], sde_type="cps"
    )
    spec = config.sampling_spec(adapter=QwenImageTrainingAdapter, model=MODEL)
    # agent loop -> server -> engine -> pipeline
    sampling_params = build_sampling_params(spec.request_params(seeds=[7, 8]), 2, adapter=QwenImageTrainingAdapter)
    assert (sampling_params.height, sampling_params.width, sampling_params.num_inference_steps) == (64, 48, 6)
    request = parse_rollout_request({"prompt_token_ids": [1, 2, 3]}, sampling_params)
    assert request.spec == SamplingSpec(**{**spec.to_dict(), "seeds": (7, 8)})
    # agent loop manager -> DataProto.meta_info -> actor
    replay = _sampling_spec(DataProto(meta_info={"sampling_spec": spec.replay().to_dict()}))
    assert replay == SamplingSpec(**{**spec.to_dict(), "seeds": ()})


def test_requests_of_one_batch_share_shape_schedule_and_guidance_but_not_seeds_or_windows():
    a = SamplingSpec(seeds=(1,), noise_level=0.0)
    assert shared_spec([a, SamplingSpec(seeds=(2,), sde_window_size=3)]) is a
    with pytest.raises(ValueError, match="share the sampling spec's height"):
        shared_spec([a, SamplingSpec(height=256)])


def test_unknown_request_keys_are_refused_naming_the_known_ones_and_llm_keys_are_ignored():
    spec, seed = SamplingSpec.from_request_params({"height": 64, "seed": 3, "temperature": 1.0})
    assert spec.height == 64 and seed == 3
    with pytest.raises(ValueError, match=r"unknown keys \['timestep_shift'\].*model_kwargs"):
        SamplingSpec.from_request_params({"timestep_shift": 3.0})


# ---- frames (video models) ----------------------------------------------------------------------


@pytest.mark.parametrize("num_frames", [2, 4, 6, 80])
def test_a_frame_count_off_the_vaes_temporal_compression_names_key_model_and_allowed_values(num_frames):
    from verl_omni.pipelines.wan2_2.training_adapter import Wan22TrainingAdapter

    with pytest.raises(ValueError) as error:
        DiffusionRolloutConfig(num_frames=num_frames).sampling_spec(adapter=Wan22TrainingAdapter, model=MODEL)
    message = str(error.value)
    assert message.startswith(f"actor_rollout_ref.rollout.num_frames={num_frames}: Wan22TrainingAdapter ({MODEL})")
    assert "4k + 1" in message and "allowed: 1, 5, 9, ..." in message


@pytest.mark.parametrize("num_frames", [1, 5, 81])
def test_frame_counts_of_4k_plus_1_pass_and_travel_to_the_engine_request(num_frames):
    from verl_omni.pipelines.wan2_2.training_adapter import Wan22TrainingAdapter

    spec = DiffusionRolloutConfig(num_frames=num_frames, height=64, width=32).sampling_spec(
        adapter=Wan22TrainingAdapter
    )
    params = build_sampling_params(spec.request_params(seeds=[3]), 1, adapter=Wan22TrainingAdapter)
    assert params.num_frames == num_frames
    assert parse_rollout_request({"prompt_token_ids": [1]}, params).spec.num_frames == num_frames
    with pytest.raises(ValueError, match="share the sampling spec's num_frames"):
        shared_spec([spec, dataclasses.replace(spec, num_frames=num_frames + 4)])


def test_a_video_size_off_the_models_32_pixel_multiple_and_frames_on_an_image_model_are_refused():
    from verl_omni.pipelines.wan2_2.training_adapter import Wan22TrainingAdapter

    with pytest.raises(ValueError, match=r"height=48: Wan22TrainingAdapter .*multiples of 32 \(e.g. 32 or 64\)"):
        DiffusionRolloutConfig(height=48).sampling_spec(adapter=Wan22TrainingAdapter, model=MODEL)
    with pytest.raises(ValueError, match=r"num_frames=5: QwenImageTrainingAdapter .* generates images; allowed: 1"):
        DiffusionRolloutConfig(num_frames=5).sampling_spec(adapter=QwenImageTrainingAdapter, model=MODEL)
    with pytest.raises(ValueError, match="^num_frames must be a positive integer"):
        SamplingSpec(num_frames=0)

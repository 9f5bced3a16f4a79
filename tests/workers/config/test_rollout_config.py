"""``DiffusionRolloutConfig`` and its YAML node: every key settable from YAML, bad values name their key."""

import pytest

from verl_omni.workers.config.rollout import DiffusionRolloutConfig


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"server_routing": {"policy": "nearest"}}, "actor_rollout_ref.rollout.server_routing.policy"),
        ({"sde_window_size": 5, "num_inference_steps": 3}, "actor_rollout_ref.rollout.sde_window_size"),
        ({"sde_window_size": 0}, "actor_rollout_ref.rollout.sde_window_size"),
        ({"sde_window_range": [2, 3], "sde_window_size": 2}, "actor_rollout_ref.rollout.sde_window_range"),
        ({"sde_window_range": [0, 11]}, "actor_rollout_ref.rollout.sde_window_range"),
        ({"height": -16}, "actor_rollout_ref.rollout.height"),
        ({"guidance_scale": -1.0}, "actor_rollout_ref.rollout.guidance_scale"),
        ({"model_kwargs": [1]}, "actor_rollout_ref.rollout.model_kwargs"),
        ({"width": 0}, "actor_rollout_ref.rollout.width"),
        ({"num_inference_steps": 0}, "actor_rollout_ref.rollout.num_inference_steps"),
        ({"noise_level": -0.1}, "actor_rollout_ref.rollout.noise_level"),
        ({"val_noise_level": -0.1}, "actor_rollout_ref.rollout.val_noise_level"),
        ({"sde_type": "ode"}, "actor_rollout_ref.rollout.sde_type"),
        ({"true_cfg_scale": 0.0}, "actor_rollout_ref.rollout.true_cfg_scale"),
        ({"n": 0}, "actor_rollout_ref.rollout.n"),
    ],
)
def test_rollout_config_names_the_bad_key(kwargs, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        DiffusionRolloutConfig(**kwargs)


def test_rollout_config_defaults_to_batched_diffusion_and_least_images_routing():
    config = DiffusionRolloutConfig()
    assert config.enable_batched_diffusion is True
    assert config.server_routing.policy == "least_images_affinity"
    assert config.agent.default_agent_loop == "diffusion_single_turn"
    assert config.sampling_spec().window_range == (0, config.num_inference_steps)


def test_yaml_node_sets_every_diffusion_field_and_builds_the_dataclass(tiny_qwen_image_path):
    from dataclasses import fields

    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import RolloutConfig

    from verl_omni.utils.config import compose_config
    from verl_omni.workers.config.model import DiffusionModelConfig

    config = compose_config("rollout_standalone", [f"actor_rollout_ref.model.path={tiny_qwen_image_path}"])
    node = config.actor_rollout_ref.rollout
    own = {f.name for f in fields(DiffusionRolloutConfig)} - {f.name for f in fields(RolloutConfig)}
    assert own <= set(node.keys()), f"keys missing from rollout/vllm_omni.yaml: {own - set(node.keys())}"
    rollout = omega_conf_to_dataclass(node)
    assert isinstance(rollout, DiffusionRolloutConfig) and rollout.name == "vllm_omni"
    assert rollout.server_routing.routing_key_field == "uid"
    assert rollout.server_routing.policy == DiffusionRolloutConfig().server_routing.policy
    model = omega_conf_to_dataclass(config.actor_rollout_ref.model)
    assert isinstance(model, DiffusionModelConfig) and model.lora.rank == 32
    assert model.tokenizer("a cat").input_ids and model.processor is None


def test_yaml_override_with_a_bad_value_names_the_key(tiny_qwen_image_path):
    from verl.utils.config import omega_conf_to_dataclass

    from verl_omni.utils.config import compose_config

    config = compose_config(
        "rollout_standalone",
        [f"actor_rollout_ref.model.path={tiny_qwen_image_path}", "actor_rollout_ref.rollout.server_routing.policy=x"],
    )
    with pytest.raises(Exception, match=r"actor_rollout_ref\.rollout\.server_routing\.policy='x' is unknown"):
        omega_conf_to_dataclass(config.actor_rollout_ref.rollout)


def test_the_hash_routing_policy_is_selectable_from_the_command_line(tiny_qwen_image_path):
    from verl.utils.config import omega_conf_to_dataclass

    from verl_omni.utils.config import compose_config

    config = compose_config(
        "rollout_standalone",
        [
            f"actor_rollout_ref.model.path={tiny_qwen_image_path}",
            "actor_rollout_ref.rollout.server_routing.policy=prompt_uid_affinity",
        ],
    )
    assert omega_conf_to_dataclass(config.actor_rollout_ref.rollout).server_routing.policy == "prompt_uid_affinity"


@pytest.mark.parametrize(
    ("requested", "colocated", "device", "transport"),
    [
        ("auto", True, "cuda", "ipc"),
        ("auto", False, "cuda", "collective"),
        ("auto", True, "cpu", "host"),
        ("auto", False, "cpu", "host"),
        ("host", True, "cuda", "host"),
        ("collective", False, "cpu", "collective"),
        ("ipc", True, None, "ipc"),
    ],
)
def test_weight_transport_auto_follows_the_placement_and_a_forced_one_is_kept(requested, colocated, device, transport):
    from verl_omni.workers.config.rollout import weight_transport_for

    assert weight_transport_for(requested, colocated, device) == transport


@pytest.mark.parametrize(
    ("requested", "colocated", "device"), [("ipc", True, "cpu"), ("ipc", False, "cuda"), ("collective", True, "cuda")]
)
def test_a_forced_weight_transport_the_placement_cannot_serve_is_refused(requested, colocated, device):
    from verl_omni.workers.config.rollout import weight_transport_for

    with pytest.raises(ValueError, match=f"actor_rollout_ref.rollout.weight_transport={requested} needs"):
        weight_transport_for(requested, colocated, device)


@pytest.mark.parametrize(("requested", "device"), [("collective", "cpu"), ("collective", None), ("auto", "cuda")])
def test_a_broadcast_to_a_split_replica_is_refused_and_the_host_serves_it(requested, device):
    from verl_omni.workers.config.rollout import weight_transport_for

    refusal = r"weight_transport=\w+ broadcasts .*rollout.ulysses_sequence_parallel_size=2: set .*transport=host"
    with pytest.raises(ValueError, match=refusal):
        weight_transport_for(requested, False, device, sequence_parallel=2)
    assert weight_transport_for("host", False, device, sequence_parallel=2) == "host"
    assert weight_transport_for("auto", True, "cuda", sequence_parallel=2) == "ipc"


def test_the_sampling_keys_are_declared_once_and_the_flat_overrides_reach_the_spec(tiny_qwen_image_path):
    from dataclasses import FrozenInstanceError, fields

    from verl.utils.config import omega_conf_to_dataclass

    from verl_omni.pipelines.sampling import SamplingSettings
    from verl_omni.utils.config import compose_config

    settings = {f.name for f in fields(SamplingSettings)}
    assert not settings & set(DiffusionRolloutConfig.__annotations__), "a sampling key is declared a second time"
    config = compose_config(
        "rollout_standalone",
        [
            f"actor_rollout_ref.model.path={tiny_qwen_image_path}",
            "actor_rollout_ref.rollout.sde_window_size=3",
            "actor_rollout_ref.rollout.sde_window_range=[1,5]",
        ],
    )
    spec = omega_conf_to_dataclass(config.actor_rollout_ref.rollout).sampling_spec()
    assert (spec.sde_window_size, spec.sde_window_range, spec.true_cfg_scale) == (3, (1, 5), 1.0)
    with pytest.raises(FrozenInstanceError, match="sde_window_size"):
        spec.sde_window_size = 4

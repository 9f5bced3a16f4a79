"""The algorithm registry and contract: names, declarations, phases, model pairing, Hydra's ``algorithm=<name>``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from verl_omni.algorithms import (
    ALGORITHM_ENTRY_POINT_GROUP,
    ALGORITHMS,
    ODE_SAMPLES,
    Algorithm,
    AlgorithmLoss,
    algorithm_config_from,
    check_model_supports,
    get_algorithm,
    register_algorithm,
)
from verl_omni.algorithms.flow_grpo import FlowGRPOAlgoConfig
from verl_omni.algorithms.grpo_guard import GRPOGuardConfig
from verl_omni.workers.config.actor import DiffusionActorConfig

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO / "verl_omni" / "trainer" / "config" / "algorithm"


def test_every_registered_algorithm_resolves_and_every_builtin_has_a_config_file():
    names = ALGORITHMS.names()
    assert {"flow_grpo", "grpo_guard"} <= set(names)
    for name in names:
        algorithm = get_algorithm(name)
        assert algorithm.name == name
        assert issubclass(algorithm.loss_cls, AlgorithmLoss)
        if not algorithm.__module__.startswith("verl_omni.algorithms."):
            continue  # registered by another package (or a test), which ships its own config
        node = OmegaConf.load(CONFIG_DIR / f"{name}.yaml").algorithm  # a global package: the node under algorithm
        config = algorithm_config_from(node)
        assert isinstance(config, algorithm.config_cls) and config.name == name


def test_unknown_algorithm_lists_the_registered_ones_and_how_to_add_one():
    with pytest.raises(ValueError, match="algorithm.name") as e:
        algorithm_config_from({"name": "no_such_algorithm"})
    message = str(e.value)
    assert "flow_grpo" in message and "grpo_guard" in message
    assert "@register_algorithm" in message and ALGORITHM_ENTRY_POINT_GROUP in message


def test_a_key_of_another_algorithm_is_refused_naming_it():
    with pytest.raises(ValueError, match="algorithm.ratio_norm is not a key of algorithm 'flow_grpo'"):
        algorithm_config_from({"name": "flow_grpo", "ratio_norm": True})
    with pytest.raises(ValueError, match="algorithm.epsilon must be > 0"):
        algorithm_config_from({"name": "grpo_guard", "epsilon": 0.0})


def test_registration_checks_type_duplicates_and_declarations():
    with pytest.raises(TypeError, match="wrong type"):
        register_algorithm("not_a_class")(object())
    with pytest.raises(ValueError, match="already registered"):
        register_algorithm("flow_grpo")(type("Other", (Algorithm,), {}))
    with pytest.raises(TypeError, match="rollout_record"):
        register_algorithm("bad_record")(type("BadRecord", (Algorithm,), {"rollout_record": "video"}))
    with pytest.raises(TypeError, match="metric_reductions"):
        type("BadLoss", (AlgorithmLoss,), {"metric_reductions": {"x": "median"}})


@pytest.mark.parametrize(
    ("name", "actor", "old_log_prob", "reference", "old_outputs"),
    [
        ("flow_grpo", {}, True, False, ("log_probs",)),
        ("flow_grpo", {"use_rollout_log_probs": True}, False, False, ("log_probs",)),
        ("flow_grpo", {"kl_beta": 0.04}, True, True, ("log_probs",)),
        ("grpo_guard", {}, True, False, ("log_probs", "prev_sample_mean")),
        ("grpo_guard", {"kl_beta": 0.01}, True, True, ("log_probs", "prev_sample_mean")),
    ],
)
def test_phases_follow_the_algorithm_and_the_actor_config(name, actor, old_log_prob, reference, old_outputs):
    algorithm = get_algorithm(name)
    actor_config = DiffusionActorConfig(**actor)
    phases = algorithm.phases(algorithm.config_cls(), actor_config)
    assert (phases.old_log_prob, phases.reference, phases.old_outputs) == (old_log_prob, reference, old_outputs)
    keys = algorithm.build_loss(actor_config, algorithm.config_cls()).required_keys
    # every key the loss reads is produced: by the old-log-prob phase, the rollout, the reference or the advantage
    produced = {f"old_{o}" for o in phases.old_outputs} if phases.old_log_prob else {"rollout_log_probs"}
    produced |= {"advantages"} | ({"ref_prev_sample_mean"} if phases.reference else set())
    assert set(keys) <= produced


def test_a_model_that_cannot_record_what_the_algorithm_needs_is_refused_naming_both():
    from verl_omni.pipelines.bagel.training_adapter import BagelTrainingAdapter
    from verl_omni.pipelines.qwen_image.training_adapter import QwenImageTrainingAdapter

    # BAGEL's rollout records SDE windows only (Qwen-Image's also records ODE samples)
    ode_algorithm = type("OdeOnly", (Algorithm,), {"rollout_record": ODE_SAMPLES, "name": "ode_only"})
    with pytest.raises(ValueError, match="algorithm=ode_only.*BagelTrainingAdapter.*'ode_samples'"):
        check_model_supports(ode_algorithm, BagelTrainingAdapter, "/models/bagel")
    restricted = type("OnlyFlowGRPO", (QwenImageTrainingAdapter,), {"algorithms": ("flow_grpo",)})
    check_model_supports(get_algorithm("flow_grpo"), restricted)
    with pytest.raises(
        ValueError,
        match=r"algorithm=grpo_guard: OnlyFlowGRPO cannot serve it: the model supports the algorithms "
        r"\['flow_grpo'\] only; algorithms this model serves: \['flow_grpo'\]",
    ):
        check_model_supports(get_algorithm("grpo_guard"), restricted)


@pytest.mark.parametrize("name", ["awm", "diffusion_dpo", "diffusion_nft", "dgpo"])
def test_an_ode_sample_algorithm_on_a_model_without_ode_recording_is_refused_naming_both(name):
    from verl_omni.pipelines.bagel.training_adapter import BagelTrainingAdapter
    from verl_omni.pipelines.qwen_image.training_adapter import QwenImageTrainingAdapter

    with pytest.raises(ValueError, match=rf"algorithm={name}: BagelTrainingAdapter .*ode_samples"):
        check_model_supports(get_algorithm(name), BagelTrainingAdapter, "/ckpt/bagel")
    check_model_supports(get_algorithm(name), QwenImageTrainingAdapter, "/ckpt/qwen")


@pytest.mark.slow  # the entry point in a fresh interpreter
def test_algorithm_group_composes_from_the_hydra_command_line():
    """``main_flowgrpo algorithm=grpo_guard algorithm.ratio_norm=false`` as a user types it (Hydra prints the job)."""
    args = [
        "-m",
        "verl_omni.trainer.main_flowgrpo",
        "algorithm=grpo_guard",
        "algorithm.ratio_norm=false",
        "--cfg",
        "job",
    ]
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    result = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    node = OmegaConf.create(result.stdout).algorithm
    config = algorithm_config_from(node)
    assert isinstance(config, GRPOGuardConfig)
    assert (config.ratio_norm, config.grad_reweight, config.adv_clip_max) == (False, True, 5.0)


def test_default_is_flow_grpo_with_the_papers_advantage():
    from verl_omni.utils.config import compose_config

    config = algorithm_config_from(compose_config("flowgrpo_trainer").algorithm)
    assert type(config) is FlowGRPOAlgoConfig
    assert (config.name, config.global_std, config.epsilon, config.adv_clip_max) == ("flow_grpo", True, 1e-4, 5.0)

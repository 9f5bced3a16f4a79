"""A worker never picks an algorithm: built without the run's ``algorithm`` node it fails naming the key."""

from __future__ import annotations

import pytest

from verl_omni.algorithms.grpo_guard import GRPOGuardConfig, GRPOGuardLoss
from verl_omni.workers.actor.diffusion_actor import DiffusionActor
from verl_omni.workers.config.actor import DiffusionActorConfig
from verl_omni.workers.engine_workers import DiffusionActorWorker
from verl_omni.workers.utils.losses import make_policy_loss


@pytest.mark.parametrize("build", [DiffusionActor, DiffusionActorWorker], ids=lambda c: c.__name__)
def test_a_worker_given_no_algorithm_names_the_missing_key(build):
    # fails before the engine or the process group is touched: the first argument is never read
    with pytest.raises(ValueError, match=rf"{build.__name__} needs the run's algorithm node \(config key `algorithm`"):
        build(None, DiffusionActorConfig(), None)


def test_a_mapping_instead_of_an_algorithm_config_is_refused_naming_the_converter():
    with pytest.raises(TypeError, match="algorithm_config_from"):
        DiffusionActor(None, DiffusionActorConfig(), {"name": "flow_grpo"})


def test_the_loss_is_the_named_algorithms():
    loss = make_policy_loss(DiffusionActorConfig(), GRPOGuardConfig())
    assert type(loss) is GRPOGuardLoss
    with pytest.raises(ValueError, match="make_policy_loss needs the run's algorithm node"):
        make_policy_loss(DiffusionActorConfig(), None)

"""An FSDP2 unit that has never run survives a backward without gradient sync under bf16 / fp32 mixed precision
(:mod:`verl_omni.workers.engine.fsdp.idle_units`). One gloo rank, real FSDP2."""

from __future__ import annotations

import pytest
import torch
from torch import nn

# a gloo process group of one rank (the process_group fixture): not the quick tier
pytestmark = pytest.mark.slow


class TwoExperts(nn.Module):
    """Two sharded experts of which the forward runs only the first, as a window of high-noise steps runs only
    Wan2.2 A14B's high-noise expert."""

    def __init__(self):
        super().__init__()
        self.used = nn.Linear(4, 4)
        self.idle = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def accumulate_without_sync(gather_first: bool) -> torch.Tensor:
    """One backward with gradient sync off (a micro-batch before the last); the used expert's accumulated gradient."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from verl_omni.workers.engine.fsdp.idle_units import gather_every_unit_once

    torch.manual_seed(0)
    model = TwoExperts()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    mesh = init_device_mesh("cpu", (1,))
    for unit in (model.used, model.idle, model):
        fully_shard(unit, mesh=mesh, mp_policy=policy)
    if gather_first:
        assert gather_every_unit_once(model) == 3
    model.set_requires_gradient_sync(False)
    model(torch.ones(2, 4)).float().sum().backward()
    model.set_requires_gradient_sync(True)
    model(torch.ones(2, 4)).float().sum().backward()
    return model.used.weight.grad.full_tensor()


def test_a_unit_that_never_ran_survives_a_backward_without_sync(process_group):
    # FSDP2 reads the unsharded tensor of every unit at the end of that backward, made only by a unit's first gather
    with pytest.raises(AttributeError, match="_unsharded_param"):
        accumulate_without_sync(gather_first=False)
    # two backwards of the same input: twice the one-sample gradient (the rows of ones, summed over 4 outputs)
    assert torch.equal(accumulate_without_sync(gather_first=True), torch.full((4, 4), 4.0))

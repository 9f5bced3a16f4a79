"""Activation checkpointing around an FSDP2 block in bf16: the recompute sees the block's inputs cast as the forward
did (:mod:`verl_omni.workers.engine.fsdp.recompute_cast`). One gloo rank, real FSDP2 and torch's checkpoint."""

from __future__ import annotations

import pytest
import torch
from torch import nn

# a gloo process group of one rank (the process_group fixture): not the quick tier
pytestmark = pytest.mark.slow


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        # the product keeps ``table`` for its backward: its dtype is what the recompute must reproduce
        return self.linear(x) * table


class Model(nn.Module):
    """A block checkpointed from its parent's forward, as diffusers does, fed an fp32 table computed outside it (the
    role of Wan2.2's rotary tables)."""

    def __init__(self, checkpointed: bool):
        super().__init__()
        self.block = Block()
        self.checkpointed = checkpointed
        self.register_buffer("table", torch.linspace(0.5, 1.5, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.checkpointed:
            return torch.utils.checkpoint.checkpoint(self.block.__call__, x, self.table, use_reentrant=False)
        return self.block(x, self.table)


def sharded_model(checkpointed: bool, cast_on_recompute: bool) -> Model:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from verl_omni.workers.engine.fsdp.recompute_cast import cast_inputs_on_recompute

    torch.manual_seed(0)
    model = Model(checkpointed)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    mesh = init_device_mesh("cpu", (1,))
    fully_shard(model.block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    if cast_on_recompute:
        assert cast_inputs_on_recompute(model, torch.bfloat16) == 2
    return model


def weight_grad(model: Model) -> torch.Tensor:
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4) / 10
    model(x).float().square().sum().backward()
    return model.block.linear.weight.grad.full_tensor()


def test_the_recompute_casts_a_blocks_inputs_as_the_forward_did(process_group):
    unchecked = weight_grad(sharded_model(checkpointed=False, cast_on_recompute=False))
    # FSDP2 cast the table to bf16 in the forward but hands the recompute the stored fp32 one
    with pytest.raises(torch.utils.checkpoint.CheckpointError, match="different metadata"):
        weight_grad(sharded_model(checkpointed=True, cast_on_recompute=False))
    # with the hook the recompute is the forward again: the gradient of the run that kept its activations, bit for bit
    assert torch.equal(weight_grad(sharded_model(checkpointed=True, cast_on_recompute=True)), unchecked)

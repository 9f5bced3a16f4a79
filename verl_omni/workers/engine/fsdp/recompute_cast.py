"""Activation checkpointing's recompute of an FSDP2 block sees its inputs in the dtype the first forward saw.

diffusers checkpoints each transformer block from its parent's forward (``checkpoint(block, *inputs)``), so the
block's FSDP2 pre-forward hook runs inside the checkpointed region. In the first forward that hook casts the block's
floating-point inputs to the compute dtype (``MixedPrecisionPolicy.cast_forward_inputs``). The recompute runs in the
block's backward, after FSDP2 has unsharded it for that backward, and FSDP2's hook then returns at once: the block
gets its inputs as the checkpoint stored them, uncast. An input that reaches the block in fp32 under a bf16 policy
(Wan2.2's rotary tables, computed from fp32 buffers outside the blocks) is then bf16 in the forward and fp32 in the
recompute, so the backward would read other values than the forward used; torch's checkpoint refuses it
(``CheckpointError: Recomputed values ... have different metadata``).

:func:`cast_inputs_on_recompute` adds a second pre-forward hook to every FSDP2 unit, after FSDP2's own, that casts
those inputs as FSDP2 does: nothing to do in the first forward (FSDP2 has cast them), the same cast in the recompute.
A model whose blocks get their inputs in the compute dtype already (or, like Qwen-Image's complex rotary table, in
no floating-point dtype) computes exactly as before.
"""

from __future__ import annotations

import torch
from torch.distributed.fsdp import FSDPModule
from torch.utils._pytree import tree_map_only


def cast_inputs_on_recompute(module: torch.nn.Module, dtype: torch.dtype) -> int:
    """Cast the floating-point inputs of every FSDP2 unit in ``module`` to ``dtype`` (FSDP2's ``param_dtype``) on each
    call, the recompute's included; returns how many units got the hook. Call after ``fully_shard``; FSDP2 puts its
    own hook first in line, so this one sees what FSDP2 has cast."""

    def cast(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(dtype) if torch.is_floating_point(tensor) and tensor.dtype != dtype else tensor

    def hook(_, args, kwargs):
        return tree_map_only(torch.Tensor, cast, (args, kwargs))

    units = [m for m in module.modules() if isinstance(m, FSDPModule)]
    for unit in units:
        unit.register_forward_pre_hook(hook, with_kwargs=True)
    return len(units)

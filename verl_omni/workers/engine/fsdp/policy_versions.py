"""Earlier versions of the trained weights, kept on each rank to replay the policy that sampled a batch.

With ``trainer.trainer_mode=separate_async`` a batch is sampled with weights up to ``trainer.max_staleness``
updates older than the actor's (``docs/guide/scale.md``, "Separate-pools asynchronous mode"). The ratio divides by the
rollout's log-prob of those weights; the actor checks it by replaying the batch with the same weights. Each rank keeps, on the host, a
copy of its local shards of every trainable tensor (the LoRA; the whole transformer with full fine-tuning)
for each version a queued batch was sampled with, and swaps it in for that replay. verl's decoupled PPO keeps
its old policy the same way (``DetachActorWorker.save_model_to_cpu`` / ``restore_model_from_cpu``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.distributed.tensor import DTensor


def _local(param: torch.Tensor) -> torch.Tensor:
    return param.to_local() if isinstance(param, DTensor) else param


def trainable_shards(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """This rank's shards of every trainable tensor, copied to the host."""
    return {name: _local(p).detach().to("cpu", copy=True) for name, p in module.named_parameters() if p.requires_grad}


@torch.no_grad()
def _load(params: dict[str, torch.Tensor], shards: dict[str, torch.Tensor]) -> None:
    for name, param in params.items():
        local = _local(param)
        local.copy_(shards[name].to(local.device, local.dtype))


@contextmanager
def weights_of(module: torch.nn.Module, shards: dict[str, torch.Tensor]) -> Iterator[None]:
    """Inside the block the module computes with ``shards`` (from :func:`trainable_shards`); the current
    weights are back afterwards, also on errors."""
    params = {name: p for name, p in module.named_parameters() if p.requires_grad}
    if set(params) != set(shards):
        raise ValueError(
            f"kept weights do not match the trained tensors: missing {sorted(set(params) - set(shards))[:4]}, "
            f"unexpected {sorted(set(shards) - set(params))[:4]}"
        )
    current = trainable_shards(module)
    _load(params, shards)
    try:
        yield
    finally:
        _load(params, current)

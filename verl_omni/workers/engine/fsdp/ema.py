"""An exponential moving average (EMA) of the trained transformer, for validation and export (full fine-tuning).

With ``actor.ema_decay`` = d > 0 (``docs/guide/training.md``) every actor rank keeps, on the host, an fp32 copy of its
local shards of every trainable tensor, starting equal to the weights the run starts from, and after each
optimizer step sets ``ema ← d·ema + (1 − d)·θ``, tensor by tensor: FSDP2 shards the parameters element-wise,
so the EMA of the shards is the shard of the EMA and no rank communicates. The copy costs 4 bytes per local
parameter of host memory and one device-to-host copy of the local shards per optimizer step; the device holds
nothing more.

The EMA never trains and never samples training rollouts. It is used three ways:

* :meth:`WeightEMA.full_tensors`: the full EMA tensors of some names (a collective), which the full-weight sync
  sends to the rollout for validation;
* :meth:`WeightEMA.swapped_in`: the module computes with the EMA weights inside the block (the checkpoint's
  ``transformer_ema/`` export goes through it) and has its live weights back, bit for bit, afterwards;
* :meth:`WeightEMA.state_dict` / :meth:`WeightEMA.load_state_dict`: the fp32 shards in each rank's engine state,
  so a resume continues the same average exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.distributed.tensor import DTensor
from verl.utils.device import get_device_id

from verl_omni.workers.engine.fsdp import checkpoint, policy_versions


def _local(param: torch.Tensor) -> torch.Tensor:
    return param.to_local() if isinstance(param, DTensor) else param


def _trainable(module: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    return {name: p for name, p in module.named_parameters() if p.requires_grad}


class WeightEMA:
    """The fp32 EMA of this rank's shards of ``module``'s trainable tensors (module docstring).

    Args:
        module (torch.nn.Module): the trained (FSDP2-sharded) module; the EMA starts equal to its weights.
        decay (float): d of ``ema ← d·ema + (1 − d)·θ``, in (0, 1).
    """

    def __init__(self, module: torch.nn.Module, decay: float):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"actor.ema_decay must be in (0, 1) for an EMA of the weights, got {decay!r}")
        self.decay = float(decay)
        self.shards = {
            name: _local(p).detach().to("cpu", torch.float32, copy=True) for name, p in _trainable(module).items()
        }
        if not self.shards:
            raise RuntimeError("the module has no trainable tensors to average")

    def _params(self, module: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
        params = _trainable(module)
        if set(params) != set(self.shards):
            raise ValueError(
                f"the EMA does not match the trained tensors: missing {sorted(set(params) - set(self.shards))[:4]}, "
                f"unexpected {sorted(set(self.shards) - set(params))[:4]}"
            )
        return params

    @torch.no_grad()
    def update(self, module: torch.nn.Module) -> None:
        """``ema ← decay·ema + (1 − decay)·θ`` for every local shard (in fp32, on the host)."""
        for name, param in self._params(module).items():
            ema = self.shards[name]
            ema.mul_(self.decay).add_(_local(param).detach().to(ema.device, torch.float32), alpha=1.0 - self.decay)

    @contextmanager
    def swapped_in(self, module: torch.nn.Module) -> Iterator[None]:
        """Inside the block ``module`` holds the EMA weights (cast to its parameters' dtype); its live weights are
        copied to the host first and put back afterwards, also on errors."""
        self._params(module)
        with policy_versions.weights_of(module, self.shards):
            yield

    @torch.no_grad()
    def full_tensors(self, module: torch.nn.Module, names: list[str]) -> dict[str, torch.Tensor]:
        """The full (unsharded) tensors ``names`` of ``module``'s state dict with the EMA in place of every trained
        tensor (a buffer or frozen tensor is the module's own), in the parameters' dtype, on CPU. A collective over
        the FSDP mesh: every rank must call it with the same names."""
        params = self._params(module)
        # buffers and frozen tensors: the module's own, gathered as every full-weight bucket is
        own = checkpoint.gather_full_tensors(module, [name for name in names if name not in params])
        full = {}
        for name in names:
            if name in own:
                full[name] = own[name]
                continue
            param, shard = params[name], self.shards[name].to(params[name].dtype)
            if isinstance(param, DTensor):
                local = shard.to(get_device_id())
                shard = DTensor.from_local(
                    local,
                    param.device_mesh,
                    param.placements,
                    run_check=False,
                    shape=param.shape,
                    stride=param.stride(),
                ).full_tensor()
            full[name] = shard.to("cpu").clone()
        return full

    def state_dict(self) -> dict:
        """What a checkpoint keeps: the decay and this rank's fp32 shards (resuming needs the same world size)."""
        return {"decay": self.decay, "shards": self.shards}

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` saved, exactly; every tensor must be there with its shard's shape. The
        decay stays this run's (``actor.ema_decay`` may change across a resume)."""
        shards = state["shards"]
        if set(shards) != set(self.shards):
            raise ValueError(
                f"the saved EMA does not match the trained tensors: missing {sorted(set(self.shards) - set(shards))[:4]}"
                f", unexpected {sorted(set(shards) - set(self.shards))[:4]}"
            )
        for name, ema in self.shards.items():
            if shards[name].shape != ema.shape:
                raise ValueError(
                    f"saved EMA shard {name} has shape {tuple(shards[name].shape)}, not {tuple(ema.shape)}: the "
                    "checkpoint was written with another world size or model"
                )
            ema.copy_(shards[name])

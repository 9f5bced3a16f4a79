"""The old policy as a second peft adapter on the trained module: an EMA of the trained LoRA.

An algorithm whose old (sampling) policy trails the trained one (DiffusionNFT's soft update
θ_old ← η·θ_old + (1 − η)·θ, ``docs/guide/algorithms.md``) declares ``Phases.old_policy_adapter``; the engine
then adds, next to the trained adapter ``default``, an adapter :data:`OLD_ADAPTER_NAME` with the same
peft config, frozen, starting equal to the trained one. It is sharded like the trained adapter (it is
added before FSDP wraps the module), so the EMA is an element-wise update of each rank's shards, and
the base weights exist once: no second transformer. A forward of the old policy switches the active
adapter for the duration of :func:`old_adapter_active`.

peft's ``set_adapter`` makes the activated adapter trainable and every other one frozen, so every
switch here goes back to the trained adapter and restores the trainable flags.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.distributed.tensor import DTensor

# the trained adapter (diffusers' default name, the one checkpoints and the rollout sync read) and the old one
TRAINED_ADAPTER_NAME = "default"
OLD_ADAPTER_NAME = "old"


def has_old_adapter(module: torch.nn.Module) -> bool:
    """Whether ``module`` carries the old-policy adapter."""
    return OLD_ADAPTER_NAME in (getattr(module, "peft_config", None) or {})


def adapter_pairs(module: torch.nn.Module) -> list[tuple[torch.nn.Parameter, torch.nn.Parameter]]:
    """``(trained, old)`` parameter pairs, matched by name (``….lora_A.default.weight`` ↔ ``….lora_A.old.weight``)."""
    params = dict(module.named_parameters())
    marker, old_marker = f".{TRAINED_ADAPTER_NAME}.", f".{OLD_ADAPTER_NAME}."
    pairs = [(p, params[n.replace(marker, old_marker)]) for n, p in params.items() if marker in n and "lora_" in n]
    if not pairs or len(pairs) != sum(old_marker in n for n in params):
        raise RuntimeError(
            f"the old-policy adapter {OLD_ADAPTER_NAME!r} does not mirror the trained adapter "
            f"{TRAINED_ADAPTER_NAME!r} ({len(pairs)} trained LoRA tensors)"
        )
    return pairs


def add_old_adapter(module: torch.nn.Module) -> None:
    """Add the frozen old-policy adapter (the trained adapter's peft config), equal to the trained one, fp32."""
    if has_old_adapter(module):
        raise RuntimeError(f"module already has an adapter named {OLD_ADAPTER_NAME!r}")
    config = module.peft_config[TRAINED_ADAPTER_NAME]
    with warnings.catch_warnings():
        # peft warns that a second adapter is being added: that is the point here
        warnings.filterwarnings("ignore", message="Already found a `peft_config` attribute")
        module.add_adapter(type(config)(**config.to_dict()), adapter_name=OLD_ADAPTER_NAME)
    _activate(module, TRAINED_ADAPTER_NAME)
    with torch.no_grad():
        for trained, old in adapter_pairs(module):
            old.data = trained.data.detach().to(torch.float32).clone()


def _activate(module: torch.nn.Module, name: str) -> None:
    """Make ``name`` the active adapter; only the trained adapter's tensors stay trainable."""
    module.set_adapter(name)
    for trained, old in adapter_pairs(module):
        trained.requires_grad_(True)
        old.requires_grad_(False)


@contextmanager
def old_adapter_active(module: torch.nn.Module) -> Iterator[None]:
    """Inside the block the module computes the old policy (the trained adapter is back afterwards, also on errors)."""
    _activate(module, OLD_ADAPTER_NAME)
    try:
        yield
    finally:
        _activate(module, TRAINED_ADAPTER_NAME)


@torch.no_grad()
def ema_update(module: torch.nn.Module, decay: float) -> None:
    """θ_old ← decay·θ_old + (1 − decay)·θ, per tensor (each rank's shards: both adapters are sharded alike)."""
    if not 0.0 <= decay <= 1.0:
        raise ValueError(f"old-policy EMA decay must be in [0, 1], got {decay}")
    for trained, old in adapter_pairs(module):
        old.copy_(old * decay + trained.detach().to(old.dtype) * (1.0 - decay))


def _local(param: torch.Tensor) -> torch.Tensor:
    return param.to_local() if isinstance(param, DTensor) else param


def local_shards(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """This rank's shards of the old adapter, by parameter name, on CPU: the checkpoint's copy (the adapter
    is nowhere else on disk; resuming needs the same world size, as the optimizer's shards do)."""
    marker = f".{OLD_ADAPTER_NAME}."
    return {n: _local(p).detach().cpu().clone() for n, p in module.named_parameters() if marker in n}


@torch.no_grad()
def load_local_shards(module: torch.nn.Module, shards: dict[str, torch.Tensor]) -> None:
    """Restore what :func:`local_shards` saved; every old-adapter tensor must be there with its shape."""
    marker = f".{OLD_ADAPTER_NAME}."
    params = {n: p for n, p in module.named_parameters() if marker in n}
    if set(params) != set(shards):
        raise ValueError(
            f"saved old-policy adapter does not match the model: missing {sorted(set(params) - set(shards))[:4]}, "
            f"unexpected {sorted(set(shards) - set(params))[:4]} (different model.lora.target_modules?)"
        )
    for name, param in params.items():
        local = _local(param)
        if local.shape != shards[name].shape:
            raise ValueError(
                f"saved old-policy shard {name} has shape {tuple(shards[name].shape)}, not {tuple(local.shape)}"
            )
        local.copy_(shards[name].to(local.device, local.dtype))

"""Checkpoints of ``DiffusersFSDPEngine``: a LoRA any diffusers user can load, plus exact-resume state.

Layout of ``<local_path>/``:

* ``lora/pytorch_lora_weights.safetensors``: full LoRA tensors written by the pipeline's
  ``save_lora_weights`` (keys ``transformer.<module>.lora_A.weight``, the peft config as
  metadata so rank and alpha survive), loadable with ``QwenImagePipeline.load_lora_weights``;
  models without a diffusers pipeline (BAGEL) get the same keys and metadata through safetensors;
* ``lora/adapter_config.json`` + ``lora/adapter_model.safetensors``: the same LoRA in PEFT's layout
  under the rollout engine's module names (the adapter's ``rollout_lora``, the form the rollout
  receives in memory), which stock vLLM-Omni serves from the directory with a file ``LoRARequest``
  on the same base model; diffusers' ``load_lora_weights`` still picks ``pytorch_lora_weights.safetensors``;
* ``engine_state_rank{r}_of{w}.pt``: rank r's optimizer state (its FSDP shards), LR schedule,
  RNG states, the global step and optimizer steps, and (an algorithm with an old-policy adapter) rank
  r's shards of that adapter, which has no other copy. Resuming needs the same world size.

The LoRA file is also what a resume loads back into the sharded model, so there is one copy of
the weights on disk.
"""

from __future__ import annotations

import logging
import random
import re
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from verl_omni.workers.engine.fsdp import old_adapter

logger = logging.getLogger(__name__)

LORA_DIR = "lora"
LORA_WEIGHT_NAME = "pytorch_lora_weights.safetensors"
# PEFT's file names, which vLLM's LoRA loader reads from a LoRARequest's directory
PEFT_CONFIG_NAME = "adapter_config.json"
PEFT_WEIGHT_NAME = "adapter_model.safetensors"
TRANSFORMER_PREFIX = "transformer."
ADAPTER_NAME = old_adapter.TRAINED_ADAPTER_NAME
# the engine state's entry holding this rank's shards of the old-policy adapter
OLD_ADAPTER_STATE = "old_adapter"


def engine_state_name(rank: int, world_size: int) -> str:
    return f"engine_state_rank{rank}_of{world_size}.pt"


def gather_lora_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Unsharded LoRA tensors on CPU, in peft's adapter-free naming. Collective over the FSDP mesh."""
    from peft.utils import get_peft_model_state_dict

    sharded = get_peft_model_state_dict(module, adapter_name=ADAPTER_NAME)
    if not sharded:
        raise RuntimeError("the model has no LoRA tensors to gather (model.lora.rank = 0?)")
    full = {}
    for name in sorted(sharded):
        tensor = sharded[name]
        tensor = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        full[name] = tensor.detach().to("cpu").clone()
    return full


def _save_lora_file(adapter, directory: Path, lora: dict[str, torch.Tensor], metadata: dict) -> None:
    """The diffusers pipeline's ``save_lora_weights`` when the model has one, else the same keys with safetensors."""
    if adapter.lora_file_pipeline is not None:
        import diffusers

        getattr(diffusers, adapter.lora_file_pipeline).save_lora_weights(
            directory,
            transformer_lora_layers=lora,
            weight_name=LORA_WEIGHT_NAME,
            safe_serialization=True,
            transformer_lora_adapter_metadata=metadata,
        )
        return
    import json

    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    tensors = {f"{TRANSFORMER_PREFIX}{name}": t.contiguous() for name, t in lora.items()}
    save_file(tensors, str(directory / LORA_WEIGHT_NAME), metadata={"lora_adapter_metadata": json.dumps(metadata)})


def _save_rollout_lora(adapter, directory: Path, lora: dict[str, torch.Tensor], metadata: dict) -> None:
    """The PEFT layout of the LoRA under the rollout's module names (``adapter.rollout_lora``), for serving engines."""
    import json

    from safetensors.torch import save_file

    config, tensors = adapter.rollout_lora(lora, metadata)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / PEFT_WEIGHT_NAME))
    (directory / PEFT_CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True))


def save_lora_dir(adapter, directory: str | Path, lora: dict[str, torch.Tensor], peft_config: dict) -> None:
    """Write a checkpoint's ``lora/`` directory (module docstring): the diffusers file and the PEFT layout.

    Args:
        adapter: the model's training adapter (LoRA file format, rollout names).
        directory: the ``lora/`` directory (created).
        lora: unsharded LoRA tensors in peft's adapter-free naming (:func:`gather_lora_state_dict`).
        peft_config: the trained ``LoraConfig`` as a dict (stored as the diffusers file's metadata).
    """
    metadata = dict(peft_config)
    metadata["target_modules"] = sorted(metadata["target_modules"])
    _save_lora_file(adapter, Path(directory), lora, metadata)
    _save_rollout_lora(adapter, Path(directory), lora, metadata)


def _rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(engine, local_path: str | Path, global_step: int) -> None:
    """Write the checkpoint of ``engine`` (a ``DiffusersFSDPEngine``); every rank must call it."""
    path = Path(local_path)
    rank, world = dist.get_rank(), dist.get_world_size()
    lora = gather_lora_state_dict(engine.module)
    if rank == 0:
        path.mkdir(parents=True, exist_ok=True)
        save_lora_dir(engine.adapter, path / LORA_DIR, lora, engine.module.peft_config[ADAPTER_NAME].to_dict())
    dist.barrier()
    state = {
        "global_step": global_step,
        "optimizer": engine.optimizer.state_dict(),
        "lr_scheduler": engine.lr_scheduler.state_dict(),
        "rng": _rng_state(),
        "optimizer_steps": engine.optimizer_steps,
    }
    if old_adapter.has_old_adapter(engine.module):
        state[OLD_ADAPTER_STATE] = old_adapter.local_shards(engine.module)
    torch.save(state, path / engine_state_name(rank, world))
    dist.barrier()
    logger.info("checkpoint of step %d written to %s", global_step, path)


def _to_module_names(lora_file: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``transformer.<m>.lora_A.weight`` → ``<m>.lora_A.default.weight`` (the injected parameter's name)."""
    out = {}
    for key, tensor in lora_file.items():
        if not key.startswith(TRANSFORMER_PREFIX):
            raise ValueError(f"LoRA file key {key!r} does not start with {TRANSFORMER_PREFIX!r}")
        name = re.sub(r"\.(lora_[AB])\.", rf".\1.{ADAPTER_NAME}.", key[len(TRANSFORMER_PREFIX) :])
        out[name] = tensor
    return out


def load_lora_into(module: torch.nn.Module, lora_path: str | Path) -> None:
    """Load a saved LoRA file into the (sharded) module; every LoRA parameter must be covered."""
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    state = _to_module_names(load_file(str(Path(lora_path) / LORA_WEIGHT_NAME)))
    # the trained adapter's tensors (an old-policy adapter beside it is restored from the engine state)
    expected = {n for n, _ in module.named_parameters() if "lora_" in n and f".{ADAPTER_NAME}." in n}
    if set(state) != expected:
        raise ValueError(
            f"LoRA file {lora_path} does not match the model: missing {sorted(expected - set(state))[:4]}, "
            f"unexpected {sorted(set(state) - expected)[:4]} (different model.lora.target_modules?)"
        )
    set_model_state_dict(module, state, options=StateDictOptions(full_state_dict=True, strict=False))


def load(engine, local_path: str | Path) -> int:
    """Restore a checkpoint written by :func:`save` into ``engine``; returns its global step."""
    path = Path(local_path)
    rank, world = dist.get_rank(), dist.get_world_size()
    state_file = path / engine_state_name(rank, world)
    if not state_file.is_file():
        raise FileNotFoundError(f"{state_file} not found: the checkpoint was written with another world size?")
    load_lora_into(engine.module, path / LORA_DIR)
    state = torch.load(state_file, weights_only=False)
    engine.optimizer.load_state_dict(state["optimizer"])
    engine.lr_scheduler.load_state_dict(state["lr_scheduler"])
    _set_rng_state(state["rng"])
    engine.optimizer_steps = state.get("optimizer_steps", 0)
    if old_adapter.has_old_adapter(engine.module):
        if OLD_ADAPTER_STATE not in state:
            raise ValueError(
                f"{state_file} has no old-policy adapter (written by a run of an algorithm without one): resume "
                "this algorithm from a checkpoint of its own runs, or start a new run"
            )
        old_adapter.load_local_shards(engine.module, state[OLD_ADAPTER_STATE])
    dist.barrier()
    return state["global_step"]

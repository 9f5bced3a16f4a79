"""Checkpoints of ``DiffusersFSDPEngine``: a LoRA (or, full fine-tuning, a transformer) any diffusers user can
load, plus exact-resume state.

Layout of ``<local_path>/``:

* full fine-tuning (``model.lora.rank=0``): ``transformer/``, the trained transformer written by its diffusers
  class's ``save_pretrained`` (``config.json`` + safetensors, sharded above 10 GB), which
  ``<TransformerClass>.from_pretrained`` (or a pipeline's ``transformer=`` argument) loads; no ``lora/``;
  with ``actor.ema_decay`` > 0 also ``transformer_ema/``, the EMA of the weights (:mod:`.ema`) in the same form
  (the module's parameter dtype), written with the EMA swapped into the module; a resume does not read it;

* ``lora/pytorch_lora_weights.safetensors``: full LoRA tensors written by the pipeline's
  ``save_lora_weights`` (keys ``transformer.<module>.lora_A.weight``, the peft config as
  metadata so rank and alpha survive), loadable with ``QwenImagePipeline.load_lora_weights``;
  models without a diffusers pipeline (BAGEL) get the same keys and metadata through safetensors;
  a module of several transformers (the adapter's ``lora_components``, the A14B's two experts) writes one such
  file per component: the first in this name, component ``c`` in ``pytorch_lora_weights_<c>.safetensors``,
  each keyed ``transformer.<module>`` as diffusers' Wan loader reads it, which loads that file into its component
  ``c`` with ``load_lora_weights(..., weight_name=..., load_into_<c>=True)`` (``load_into_transformer_2``; the
  calls: :func:`lora_load_calls`);
* ``lora/adapter_config.json`` + ``lora/adapter_model.safetensors``: the same LoRA in PEFT's layout
  under the rollout engine's module names (the adapter's ``rollout_lora``, the form the rollout
  receives in memory), which stock vLLM-Omni serves from the directory with a file ``LoRARequest``
  on the same base model; diffusers' ``load_lora_weights`` still picks ``pytorch_lora_weights.safetensors``;
* ``engine_state_rank{r}_of{w}.pt``: rank r's optimizer state (its FSDP shards), LR schedule,
  RNG states, the global step and optimizer steps, and (an algorithm with an old-policy adapter) rank
  r's shards of that adapter, which has no other copy, and (``actor.ema_decay`` > 0) rank r's fp32 EMA shards, from
  which a resume continues the average exactly. Resuming needs the same world size.

The LoRA file (the transformer directory) is also what a resume loads back into the sharded model, so
there is one copy of the weights on disk.
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
from verl.utils.device import get_device_id

from verl_omni.workers.engine.fsdp import old_adapter

logger = logging.getLogger(__name__)

LORA_DIR = "lora"
TRANSFORMER_DIR = "transformer"
# full fine-tuning with actor.ema_decay > 0: the EMA of the weights, as save_pretrained writes it
TRANSFORMER_EMA_DIR = "transformer_ema"
LORA_WEIGHT_NAME = "pytorch_lora_weights.safetensors"
# PEFT's file names, which vLLM's LoRA loader reads from a LoRARequest's directory
PEFT_CONFIG_NAME = "adapter_config.json"
PEFT_WEIGHT_NAME = "adapter_model.safetensors"
TRANSFORMER_PREFIX = "transformer."
ADAPTER_NAME = old_adapter.TRAINED_ADAPTER_NAME
# the engine state's entry holding this rank's shards of the old-policy adapter
OLD_ADAPTER_STATE = "old_adapter"
# the engine state's entry holding this rank's fp32 shards of the EMA of the weights
EMA_STATE = "ema"


def engine_state_name(rank: int, world_size: int) -> str:
    return f"engine_state_rank{rank}_of{world_size}.pt"


def gather_lora_state_dict(module: torch.nn.Module, to_host: bool = True) -> dict[str, torch.Tensor]:
    """Unsharded LoRA tensors on CPU (``to_host=False``: on this rank's device), in peft's adapter-free naming.
    Collective over the FSDP mesh."""
    from peft.utils import get_peft_model_state_dict

    sharded = get_peft_model_state_dict(module, adapter_name=ADAPTER_NAME)
    if not sharded:
        raise RuntimeError("the model has no LoRA tensors to gather (model.lora.rank = 0?)")
    full = {}
    for name in sorted(sharded):
        tensor = sharded[name]
        tensor = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        full[name] = _landed(tensor, to_host)
    return full


def gather_full_tensors(module: torch.nn.Module, names: list[str], to_host: bool = True) -> dict[str, torch.Tensor]:
    """Full (unsharded) tensors ``names`` of the module's state dict, on CPU (``to_host=False``: on this rank's
    device, for a transport that reads them there). Collective over the FSDP mesh."""
    state = module.state_dict()
    missing = [name for name in names if name not in state]
    if missing:
        raise KeyError(f"the trained module has no tensors {missing[:4]}")
    device = get_device_id()
    full = {}
    for name in names:
        tensor = state[name]
        # shards offloaded to the host (param_offload between phases, or engine.offload_policy) gather on the device
        tensor = tensor.to(device).full_tensor() if isinstance(tensor, DTensor) else tensor
        full[name] = _landed(tensor, to_host)
    return full


def _landed(tensor: torch.Tensor, to_host: bool) -> torch.Tensor:
    """A gathered tensor as the caller keeps it: a host copy, or on the device as gathered (it may share the
    parameter's memory on one rank: the caller copies it before the next optimizer step)."""
    tensor = tensor.detach()
    return tensor.to("cpu").clone() if to_host else tensor.to(get_device_id())


def save_transformer_dir(module_class, config, directory: Path, state: dict[str, torch.Tensor]) -> None:
    """The trained transformer through its diffusers class's ``save_pretrained``: the class is rebuilt from
    ``config`` on the meta device and takes the gathered ``state`` as its tensors (no second copy)."""
    with torch.device("meta"):
        model = module_class.from_config(config)
    model.load_state_dict(state, strict=True, assign=True)
    model.save_pretrained(directory, safe_serialization=True)


def read_transformer_dir(directory: Path) -> dict[str, torch.Tensor]:
    """The tensors a ``save_pretrained`` directory holds (one safetensors file, or the shards its index names)."""
    import json

    from safetensors.torch import load_file

    index = directory / "diffusion_pytorch_model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else None
    files = files or ["diffusion_pytorch_model.safetensors"]
    state = {}
    for name in files:
        if not (directory / name).is_file():
            raise FileNotFoundError(f"{directory / name} not found: the checkpoint's transformer is incomplete")
        state.update(load_file(str(directory / name)))
    return state


def _save_weights(engine, path: Path, rank: int) -> None:
    """The trained weights of the checkpoint: the LoRA directory, or the full transformer (rank 0 writes)."""
    if engine._is_lora:
        lora = gather_lora_state_dict(engine.module)
        if rank == 0:
            save_lora_dir(engine.adapter, path / LORA_DIR, lora, engine.module.peft_config[ADAPTER_NAME].to_dict())
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(engine.module, options=options)
    if rank == 0:
        save_transformer_dir(engine.module_class, engine.module.config, path / TRANSFORMER_DIR, state)
    if engine.ema is not None:
        del state
        # the same gather with the EMA in the module (rank 0 alone holds the full tensors), written before the live
        # weights come back: on one rank the gathered tensors may be the parameters' own storage
        with engine.ema.swapped_in(engine.module):
            state = get_model_state_dict(engine.module, options=options)
            if rank == 0:
                save_transformer_dir(engine.module_class, engine.module.config, path / TRANSFORMER_EMA_DIR, state)


def _load_weights(engine, path: Path) -> None:
    """Load what :func:`_save_weights` wrote into the sharded module (every rank reads the files)."""
    if engine._is_lora:
        load_lora_into(engine.module, path / LORA_DIR, engine.adapter.lora_components)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    directory = path / TRANSFORMER_DIR
    if not directory.is_dir():
        raise FileNotFoundError(
            f"{directory} not found: the checkpoint is not of a full fine-tuning run (model.lora.rank=0); resume "
            "it with the LoRA settings it was written with"
        )
    state = read_transformer_dir(directory)
    set_model_state_dict(engine.module, state, options=StateDictOptions(full_state_dict=True, strict=True))


def lora_weight_name(component: str, components: tuple[str, ...]) -> str:
    """The diffusers LoRA file of ``component`` (module docstring): the default name for the first, else its own."""
    return LORA_WEIGHT_NAME if component == components[0] else f"pytorch_lora_weights_{component}.safetensors"


def lora_load_calls(lora_dir: str | Path) -> list[dict]:
    """The keyword arguments of each diffusers ``load_lora_weights(lora_dir, **kwargs)`` call that loads a checkpoint's
    ``lora/`` directory into a pipeline: ``{}`` (the default file), then one per further component's file."""
    calls = [{}]
    for path in sorted(Path(lora_dir).glob("pytorch_lora_weights_*.safetensors")):
        component = path.name[len("pytorch_lora_weights_") : -len(".safetensors")]
        calls.append({"weight_name": path.name, f"load_into_{component}": True})
    return calls


def _component_tensors(lora: dict[str, torch.Tensor], components: tuple[str, ...]) -> dict[str, dict]:
    """``{weight file: that file's tensors}``: the LoRA split by its components' name prefixes (none: one file)."""
    if not components:
        return {LORA_WEIGHT_NAME: lora}
    files = {}
    for component in components:
        prefix = f"{component}."
        files[lora_weight_name(component, components)] = {
            name[len(prefix) :]: t for name, t in lora.items() if name.startswith(prefix)
        }
    stray = sorted(n for n in lora if not any(n.startswith(f"{c}.") for c in components))
    if stray or not all(files.values()):
        raise ValueError(
            f"LoRA tensors must each belong to one of the components {list(components)} and every component must "
            f"have some: stray {stray[:4]}, empty {[f for f, t in files.items() if not t]}"
        )
    return files


def pipeline_loads_lora(pipeline: str | None) -> bool:
    """Whether diffusers' ``pipeline`` class has a LoRA loader (``load_lora_weights``); HunyuanVideo-1.5's pipelines
    have none, and their transformer's own ``load_lora_adapter`` reads the same file."""
    if pipeline is None:
        return False
    import diffusers

    cls = getattr(diffusers, pipeline, None)
    # a name diffusers does not export is left to fail where it is used, naming it
    return cls is None or hasattr(cls, "load_lora_weights")


def _save_lora_file(adapter, directory: Path, lora: dict[str, torch.Tensor], metadata: dict) -> None:
    """The diffusers pipeline's ``save_lora_weights`` when the model's pipeline has a LoRA loader (a file per
    component), else the same keys and metadata with safetensors."""
    if pipeline_loads_lora(adapter.lora_file_pipeline):
        import diffusers

        for weight_name, tensors in _component_tensors(lora, adapter.lora_components).items():
            getattr(diffusers, adapter.lora_file_pipeline).save_lora_weights(
                directory,
                transformer_lora_layers=tensors,
                weight_name=weight_name,
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
    if rank == 0:
        path.mkdir(parents=True, exist_ok=True)
    _save_weights(engine, path, rank)
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
    if engine.ema is not None:
        state[EMA_STATE] = engine.ema.state_dict()
    torch.save(state, path / engine_state_name(rank, world))
    dist.barrier()
    logger.info("checkpoint of step %d written to %s", global_step, path)


def _to_module_names(lora_file: dict[str, torch.Tensor], component: str = "") -> dict[str, torch.Tensor]:
    """``transformer.<m>.lora_A.weight`` → ``[<component>.]<m>.lora_A.default.weight`` (the injected parameter's name)."""
    out = {}
    for key, tensor in lora_file.items():
        if not key.startswith(TRANSFORMER_PREFIX):
            raise ValueError(f"LoRA file key {key!r} does not start with {TRANSFORMER_PREFIX!r}")
        name = re.sub(r"\.(lora_[AB])\.", rf".\1.{ADAPTER_NAME}.", key[len(TRANSFORMER_PREFIX) :])
        out[f"{component}.{name}" if component else name] = tensor
    return out


def load_lora_into(module: torch.nn.Module, lora_path: str | Path, components: tuple[str, ...] = ()) -> None:
    """Load a saved LoRA directory into the (sharded) module; every LoRA parameter must be covered.

    ``components``: the adapter's ``lora_components`` (one file per component), empty for one transformer.
    """
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    state = {}
    for component in components or ("",):
        weight_name = lora_weight_name(component, components) if components else LORA_WEIGHT_NAME
        state.update(_to_module_names(load_file(str(Path(lora_path) / weight_name)), component))
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
    _load_weights(engine, path)
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
    if engine.ema is not None:
        if EMA_STATE not in state:
            raise ValueError(
                f"{state_file} has no EMA of the weights (written by a run with actor.ema_decay=0): resume with "
                "actor_rollout_ref.actor.ema_decay=0, or start a new run"
            )
        engine.ema.load_state_dict(state[EMA_STATE])
    dist.barrier()
    return state["global_step"]

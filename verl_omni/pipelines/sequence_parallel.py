"""Ulysses sequence parallelism of a diffusers transformer, through diffusers' own context parallelism.

The ranks of one sequence-parallel group hold the same samples; each runs the transformer on its slice of every
sample's tokens and, around each attention, trades that token slice for a slice of the heads by all-to-all
(``ContextParallelConfig(ulysses_degree=...)`` with the transformer's ``_cp_plan``: where the sequence is split,
which rotary tables follow it, where the output is gathered back). diffusers' attention dispatch carries the
backward of those exchanges, so gradients flow through the split forward; the gather at the output hands each rank
the gradient of its own tokens, so the group's gradients sum to the unsplit one (the engine weighs the loss for
that, :mod:`verl_omni.workers.engine.fsdp.diffusers_impl`).

A model adapter that can split says so with ``supports_sequence_parallel`` and calls :func:`enable_ulysses` from
its ``enable_sequence_parallel`` (adding what its own transformer needs on top, e.g. Qwen-Image's text padding).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

# names diffusers reads from the context-parallel mesh: (ring, ulysses); ring attention stays 1 here
CONTEXT_PARALLEL_DIMS = ("ring", "ulysses")


def context_parallel_mesh(device_type: str, sequence_parallel_size: int):
    """The ``(ring=1, ulysses=sp)`` mesh diffusers reads, inside a ``(dp, ring, ulysses)`` mesh over every rank: rank
    ``d·sp + s`` is rank ``s`` of data-parallel group ``d``, as in verl's ``(dp, sp)`` Ulysses mesh."""
    from torch.distributed.device_mesh import init_device_mesh

    world = torch.distributed.get_world_size()
    mesh = init_device_mesh(
        device_type,
        (world // sequence_parallel_size, 1, sequence_parallel_size),
        mesh_dim_names=("dp", *CONTEXT_PARALLEL_DIMS),
    )
    return mesh[CONTEXT_PARALLEL_DIMS]


def splittable_transformers(module: torch.nn.Module) -> list[torch.nn.Module]:
    """``module`` and its submodules that declare a context-parallel plan (``_cp_plan``): one transformer, or each
    expert of a model that holds several."""
    return [m for m in module.modules() if getattr(m, "_cp_plan", None)]


def enable_ulysses(module: torch.nn.Module, mesh) -> list[torch.nn.Module]:
    """Split every transformer of ``module`` over ``mesh``'s ulysses ranks (diffusers' ``enable_parallelism``);
    returns them.

    Raises:
        ValueError: ``module`` holds no transformer with a context-parallel plan.
    """
    from diffusers.models._modeling_parallel import ContextParallelConfig

    transformers = splittable_transformers(module)
    if not transformers:
        raise ValueError(
            f"{type(module).__name__} declares no context-parallel plan (_cp_plan): it cannot split its sequence; "
            "set actor_rollout_ref.actor.ulysses_sequence_parallel_size=1"
        )
    degree = mesh[CONTEXT_PARALLEL_DIMS[1]].size()
    for transformer in transformers:
        transformer.enable_parallelism(config=ContextParallelConfig(ulysses_degree=degree, mesh=mesh))
    return transformers


def attention_heads(model_path: str | Path, subfolder: str = "transformer") -> int:
    """The transformer's attention heads (``num_attention_heads`` of ``<subfolder>/config.json``): Ulysses hands each
    rank of a group ``heads / sp`` of them."""
    config = Path(model_path) / subfolder / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"{config} not found: the sequence-parallel degree is checked against its heads")
    return int(json.loads(config.read_text())["num_attention_heads"])

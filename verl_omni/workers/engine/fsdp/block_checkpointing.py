"""Gradient checkpointing on a share of the transformer's blocks: less recompute where memory allows more activations.

diffusers checkpoints every block its forward loops over (``self._gradient_checkpointing_func(block, *inputs)``). The
recompute is one more forward of each block in the backward: with a LoRA about a third of a replayed step's block
compute (forward 1, recompute 1, backward about 1: the frozen base weights get no weight gradients), with full
fine-tuning a quarter. Without checkpointing a block keeps its activations from its forward to its backward, which at
the OCR recipe's micro-batch costs more memory than a GPU has for all of them, but not for some: a block that keeps
its activations saves its recompute. :func:`checkpoint_share_of_blocks` gives the model a checkpointing function that
recomputes only ``fraction`` of the blocks, spread evenly over the forward, and runs the others as plain calls.
"""

from __future__ import annotations

import inspect
import math

import torch
from torch.utils.checkpoint import checkpoint


def blocks_of_classes(module: torch.nn.Module, block_classes, key: str) -> list[torch.nn.Module]:
    """The submodules of ``module`` whose class (or, once FSDP2 has subclassed it, its base) is named in
    ``block_classes`` (the adapter's ``fsdp_wrap_blocks``), in module order.

    Raises:
        ValueError: none matched; the message names ``key``, the setting that asked for the blocks.
    """
    names = set(block_classes)
    blocks = [m for m in module.modules() if {c.__name__ for c in type(m).__mro__} & names]
    if not blocks:
        raise ValueError(f"{key} found no block of classes {sorted(names)} in {type(module).__name__}")
    return blocks


def recomputed_indices(count: int, fraction: float) -> set[int]:
    """The indices among ``count`` blocks to recompute, ``⌊fraction · count⌋`` of them spread evenly (every
    block at 1.0, none at 0.0): block i is recomputed when the running share ``fraction · (i + 1)`` passes a whole
    number, so a half recomputes every other block."""
    return {i for i in range(count) if math.floor(fraction * (i + 1) + 1e-9) > math.floor(fraction * i + 1e-9)}


def checkpoint_share_of_blocks(module: torch.nn.Module, block_classes, fraction: float) -> int:
    """Turn on the model's gradient checkpointing for ``fraction`` (in [0, 1]) of its blocks whose class (or, after
    FSDP2 has subclassed it, its base) is named in ``block_classes``; returns how many are recomputed. A module the
    model checkpoints that is not one of those blocks is recomputed as before.

    Raises:
        ValueError: the model's ``enable_gradient_checkpointing`` takes no checkpointing function (a model that is
            not a diffusers ``ModelMixin``), or no block of ``block_classes`` is in the module.
    """
    enable = module.enable_gradient_checkpointing
    if "gradient_checkpointing_func" not in inspect.signature(enable).parameters:
        raise ValueError(
            f"model.gradient_checkpointing_fraction={fraction}: {type(module).__name__}.enable_gradient_checkpointing "
            "takes no checkpointing function, so its blocks are all recomputed or none; set the fraction to 1.0"
        )
    blocks = blocks_of_classes(module, block_classes, "model.gradient_checkpointing_fraction")
    recomputed = recomputed_indices(len(blocks), fraction)
    kept = {id(block) for i, block in enumerate(blocks) if i not in recomputed}

    def checkpoint_some(block, *args, **kwargs):
        if id(block) in kept:
            return block(*args, **kwargs)
        return checkpoint(block.__call__, *args, use_reentrant=False, **kwargs)

    enable(gradient_checkpointing_func=checkpoint_some)
    return len(recomputed)

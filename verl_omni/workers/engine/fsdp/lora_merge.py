"""The trained LoRA merged into the frozen weights it adapts, as the rollout computes with it (``model.lora.merge``).

A rollout that serves the LoRA as an adapter runs its low-rank products beside every adapted linear in every
forward: that costs the compiled rollout far more than the adapter's share of the FLOPs (``docs/perf.md``),
because each slice's products and adds are separate memory-bound kernels. Merged,
the rollout computes with plain linears: each sync sends, for every adapted linear, ``W + scaling · B @ A``
under the linear's own diffusers name (``...attn.to_q.weight``), through the same checked buckets as full
fine-tuning (:mod:`~verl_omni.workers.rollout.weight_buckets`); everything else in the rollout stays as loaded.

The merge is computed in fp32 from the frozen base weight and rounded once to the base's dtype, so the rollout's
weight is the nearest one to the actor's ``W + ΔW`` its dtype holds: in bf16 a ``ΔW`` element under half a unit
in the last place of ``W`` does not move it, the same rounding the base weight itself carries. Its effect shows
in the rollout-vs-actor log-prob difference each step logs (``old_log_prob/rollout_diff_max``).
"""

from __future__ import annotations

import torch

from verl_omni.workers.engine.fsdp import checkpoint

# the peft name part between an adapted linear's path and its frozen weight
BASE_LAYER = ".base_layer"


def adapted_linears(module: torch.nn.Module, adapter: str = checkpoint.ADAPTER_NAME) -> dict[str, torch.nn.Module]:
    """The linears the trained adapter wraps, by module path (``transformer_blocks.0.attn.to_q``).

    Raises:
        ValueError: the adapter uses DoRA, whose weight is not ``W + scaling · B @ A``.
    """
    from peft.tuners.lora import LoraLayer

    layers = {}
    for path, layer in module.named_modules():
        if isinstance(layer, LoraLayer) and adapter in layer.lora_A:
            if layer.use_dora.get(adapter, False):
                raise ValueError(f"{path}: a DoRA adapter does not merge as W + scaling * B @ A")
            layers[path] = layer
    return layers


def merged_sizes(module: torch.nn.Module) -> list[tuple[str, int]]:
    """``(name, bytes)`` of each merged weight, in the module's order: the plan of the sync's buckets."""
    sizes = []
    for path, layer in adapted_linears(module).items():
        weight = layer.get_base_layer().weight
        sizes.append((f"{path}.weight", weight.numel() * weight.element_size()))
    return sizes


def merged_weights(module: torch.nn.Module, names: list[str], to_host: bool = True) -> dict[str, torch.Tensor]:
    """``W + scaling · B @ A`` of each adapted linear in ``names`` (``<path>.weight``), in the base weight's dtype,
    on CPU (``to_host=False``: on this rank's device). A collective over the FSDP mesh, as a gather is."""
    layers = adapted_linears(module)
    adapter = checkpoint.ADAPTER_NAME
    paths = [name.removesuffix(".weight") for name in names]
    unknown = [name for name, path in zip(names, paths, strict=True) if path not in layers]
    if unknown:
        raise KeyError(f"{unknown[:3]} are not weights of linears the LoRA adapts (have e.g. {list(layers)[:3]})")
    parts = {
        path: (f"{path}{BASE_LAYER}.weight", f"{path}.lora_A.{adapter}.weight", f"{path}.lora_B.{adapter}.weight")
        for path in paths
    }
    # one gather for the bucket (each gather walks the module's state dict)
    full = checkpoint.gather_full_tensors(module, [part for three in parts.values() for part in three], to_host=False)
    merged = {}
    for name, path in zip(names, paths, strict=True):
        base, lora_a, lora_b = (full.pop(part) for part in parts[path])
        weight = (base.float() + layers[path].scaling[adapter] * (lora_b.float() @ lora_a.float())).to(base.dtype)
        merged[name] = weight.to("cpu") if to_host else weight
    return merged

"""A trained LoRA as the rollout engine loads it: PEFT names of the rollout's modules, fused layers fused.

Two clients read this form: the rollout, which gets it in memory after every update
(``DiffusersFSDPEngine.get_per_tensor_param``), and stock vLLM-Omni, which reads it from a
checkpoint's ``adapter_config.json`` + ``adapter_model.safetensors`` (``workers/engine/fsdp/checkpoint.py``).
Both parse PEFT's layout: tensors ``base_model.model.<module>.lora_A.weight`` / ``lora_B.weight``
and a ``LoraConfig`` dict whose ``target_modules`` name the modules.

The model facts come from the adapter (``ModelAdapter.rollout_name_map`` renames modules;
``ModelAdapter.rollout_fused_lora_modules`` names fused layers whose sub-layer adapters vLLM-Omni
does not route itself); this module knows no model.

Fusing k sub-layer adapters ``(A_i [r, in], B_i [out_i, r])`` of one fused layer gives one adapter
``A = [A_1; ...; A_k]`` ``[k·r, in]`` and ``B = blockdiag(B_1, ..., B_k)`` ``[Σ out_i, k·r]``: slice i of
``B·A`` is ``B_i·A_i`` exactly (the other terms multiply zeros). vLLM-Omni splits such a B by the
layer's output slices and applies the shared A to each. The config's rank becomes k·r and its alpha
is scaled so that the scaling (alpha / r, or alpha / sqrt(r) with rsLoRA) is unchanged; the
unfused modules keep their rank-r tensors (vLLM fills the rank buffer partially).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch

PEFT_PREFIX = "base_model.model."
LORA_A, LORA_B = "lora_A", "lora_B"


def _split(name: str) -> tuple[str, str]:
    """``<module>.lora_A.weight`` → (``<module>``, ``lora_A.weight``)."""
    for part in (LORA_A, LORA_B):
        marker = f".{part}."
        if marker in name:
            module, _, rest = name.partition(marker)
            return module, f"{part}.{rest}"
    raise ValueError(f"LoRA tensor {name!r} is neither a lora_A nor a lora_B weight (peft's state-dict naming)")


def _fused_sub_layer(module: str, sub_to_fused: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(prefix, sub-layer)`` when ``module`` ends, on a ``.`` boundary, with a fused layer's sub-layer path (a
    leaf name ``to_q``, or a trailing path ``attn1.to_q`` when only some attentions of a block are fused)."""
    for sub in sub_to_fused:
        if module == sub or module.endswith(f".{sub}"):
            return module[: -len(sub)].rstrip("."), sub
    return None


def fuse_lora_modules(
    tensors: Mapping[str, torch.Tensor], fused_layers: Iterable[tuple[str, tuple[str, ...]]]
) -> tuple[dict[str, torch.Tensor], int]:
    """Fuse sub-layer adapters into their fused layer's adapter (module docstring).

    Args:
        tensors: ``<module>.lora_A.weight`` / ``<module>.lora_B.weight`` (rollout module names).
        fused_layers: ``(fused layer, sub-layers in slice order)``, leaf names (``("to_qkv", ("to_q", "to_k", "to_v"))``)
            or trailing paths of one prefix (``("attn1.to_qkv", ("attn1.to_q", "attn1.to_k", "attn1.to_v"))``: the
            other attentions' ``to_q`` stay unfused).

    Returns:
        The tensors with each fused group replaced by one adapter of the fused layer, and the largest
        number of sub-layers fused into one (1 when nothing was fused): the factor the rank grows by.
    """
    sub_to_fused = {sub: (fused, subs) for fused, subs in fused_layers for sub in subs}
    groups: dict[tuple[str, str], dict[str, dict[str, torch.Tensor]]] = {}
    out: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        module, weight = _split(name)
        match = _fused_sub_layer(module, sub_to_fused)
        if match is None:
            out[name] = tensor
            continue
        prefix, sub = match
        fused = sub_to_fused[sub][0]
        groups.setdefault((prefix, fused), {}).setdefault(sub, {})[weight.split(".")[0]] = tensor
    factor = 1
    for (prefix, fused), found in sorted(groups.items()):
        subs = sub_to_fused[next(iter(found))][1]
        missing = [s for s in subs if s not in found or set(found[s]) != {LORA_A, LORA_B}]
        if missing:
            raise ValueError(
                f"the rollout fuses {list(subs)} of {prefix or '<root>'} into one layer {fused!r}, but the LoRA has no "
                f"lora_A/lora_B for {missing}: target all of {list(subs)} (model.lora.target_modules) or none"
            )
        a = torch.cat([found[s][LORA_A] for s in subs], dim=0)
        b = torch.block_diag(*[found[s][LORA_B] for s in subs])
        module = f"{prefix}.{fused}" if prefix else fused
        out[f"{module}.{LORA_A}.weight"], out[f"{module}.{LORA_B}.weight"] = a, b
        factor = max(factor, len(subs))
    return out, factor


def fused_peft_config(
    config: Mapping[str, Any], fused_layers: Iterable[tuple[str, tuple[str, ...]]], factor: int
) -> dict[str, Any]:
    """The peft config of a LoRA fused by :func:`fuse_lora_modules` with rank factor ``factor``: sub-layer
    targets renamed to their fused layer, rank times ``factor``, alpha so that the scaling is unchanged."""
    out = dict(config)
    if factor == 1:
        return out
    if out.get("rank_pattern") or out.get("alpha_pattern"):
        raise ValueError(
            "a LoRA with rank_pattern / alpha_pattern cannot be fused for the rollout (its fused layers would need "
            "per-module ranks): use one rank and alpha for every target module"
        )
    if not isinstance(out.get("target_modules"), (list, tuple, set)):
        raise ValueError(
            f"target_modules={out.get('target_modules')!r}: a LoRA fused for the rollout needs a list of module "
            "names (model.lora.target_modules), not a pattern"
        )
    leaf_fused = {sub: fused for fused, subs in fused_layers for sub in subs if "." not in sub}
    targets = []
    for target in out["target_modules"]:
        prefix, _, leaf = target.rpartition(".")
        fused = leaf_fused.get(leaf)
        targets.append(target if fused is None else (f"{prefix}.{fused}" if prefix else fused))
    # a fused layer named by a trailing path: its sub-layers' leaf targets still name the unfused layers elsewhere
    targets += [fused.rpartition(".")[2] for fused, subs in fused_layers if any("." in sub for sub in subs)]
    out["target_modules"] = sorted(set(targets))
    rank = int(out["r"])
    alpha_factor = math.sqrt(factor) if out.get("use_rslora") else factor
    out["r"], out["lora_alpha"] = rank * factor, float(out.get("lora_alpha", rank)) * alpha_factor
    return out


def to_rollout_lora(
    adapter, tensors: Mapping[str, torch.Tensor], peft_config: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``(peft config, PEFT-named tensors)`` of a trained LoRA for the rollout of ``adapter``'s model.

    Args:
        adapter: the model's :class:`~verl_omni.pipelines.model_base.ModelAdapter` (names, fused layers).
        tensors: ``<module>.lora_A.weight`` / ``lora_B.weight`` as peft's ``get_peft_model_state_dict``
            names them for the trained module.
        peft_config: the trained ``LoraConfig`` as a dict (``r``, ``lora_alpha``, ``target_modules``, ...).
    """
    config = adapter.rollout_peft_config(dict(peft_config))
    renamed = {adapter.rollout_name(name): t for name, t in tensors.items()}
    fused, factor = fuse_lora_modules(renamed, adapter.rollout_fused_lora_modules)
    config = fused_peft_config(config, adapter.rollout_fused_lora_modules, factor)
    return config, {f"{PEFT_PREFIX}{name}": t.contiguous() for name, t in sorted(fused.items())}

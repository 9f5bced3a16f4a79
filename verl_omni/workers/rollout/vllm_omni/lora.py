"""LoRA adapters as in-memory tensors for vLLM-Omni's diffusion LoRA manager.

vLLM-Omni 0.26 loads diffusion LoRA adapters from a path only. ``TensorLoRARequest`` carries the
PEFT config and the tensors themselves; the worker extension builds it from plain fields that our
own RPC carries to the diffusion workers (no files; vLLM-Omni's ``add_lora`` would rebuild it as a
plain ``LoRARequest`` on the way to a multi-stage engine's DiT process), and ``TensorLoRAManager``
— installed by our worker extension when the worker builds its LoRA manager — builds the adapter
from them. ``binding`` is the probe the server runs after
every sync: an adapter whose names match no module (or only some of them) would otherwise
train weights the rollout never uses while it looks healthy.

Names arrive as the rollout pipeline names its modules: the trainer renames them (and fuses the
sub-layer adapters of fused layers vLLM-Omni does not route itself) with its model's adapter
(``ModelAdapter.rollout_lora``), so this module knows no model; an adapter still in training names
fails the probe, naming the tensors.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from vllm.lora.lora_model import LoRAModel
from vllm.lora.peft_helper import PEFTHelper
from vllm.lora.request import LoRARequest
from vllm_omni.diffusion.lora.manager import DiffusionLoRAManager

logger = logging.getLogger(__name__)

# vLLM's LoRARequest requires a path; in-memory adapters get this marker instead of a file path.
IN_MEMORY_LORA_SCHEME = "in-memory://"


def in_memory_lora_path(adapter_id: int) -> str:
    return f"{IN_MEMORY_LORA_SCHEME}verl_omni/{adapter_id}"


class TensorLoRARequest(LoRARequest):
    """A LoRA request whose adapter is given as tensors.

    Args (beyond ``LoRARequest``'s):
        peft_config (`dict`): the adapter's PEFT ``LoraConfig`` as a dict (``r``, ``lora_alpha``,
            ``target_modules``, ...), ``target_modules`` named as the rollout's modules.
        lora_tensors (`dict[str, torch.Tensor]`): PEFT-named ``lora_A``/``lora_B`` weights
            (``base_model.model.<rollout module name>.lora_A.weight``).
    """

    peft_config: dict | None = None
    lora_tensors: dict | None = None

    def without_tensors(self) -> LoRARequest:
        """The light request that per-generation sampling params carry once the adapter is loaded."""
        return LoRARequest(lora_name=self.lora_name, lora_int_id=self.lora_int_id, lora_path=self.lora_path)


class TensorLoRAManager(DiffusionLoRAManager):
    """vLLM-Omni's diffusion LoRA manager that also accepts :class:`TensorLoRARequest`."""

    def _load_adapter(self, lora_request: LoRARequest) -> tuple[LoRAModel, PEFTHelper]:
        tensors = getattr(lora_request, "lora_tensors", None)
        if tensors is None:
            if lora_request.lora_path.startswith(IN_MEMORY_LORA_SCHEME):
                raise ValueError(
                    f"LoRA adapter {lora_request.lora_int_id} is not loaded in the worker and the request carries "
                    "no tensors: push it again with a TensorLoRARequest"
                )
            return super()._load_adapter(lora_request)
        if not self._expected_lora_modules:
            raise ValueError("No supported LoRA modules found in the diffusion pipeline.")
        peft_helper = PEFTHelper.from_dict(dict(lora_request.peft_config or {}))
        # host tensors (the pickled sync) stay on the host until activation; tensors opened by CUDA IPC and
        # copied on the GPU (``device_share``) stay there
        device = next(iter(tensors.values())).device if tensors else torch.device("cpu")
        lora_model = LoRAModel.from_lora_tensors(
            lora_model_id=lora_request.lora_int_id,
            tensors=dict(tensors),
            peft_helper=peft_helper,
            device=str(device),
            dtype=self.dtype,
            model_vocab_size=None,
            weights_mapper=None,
        )
        for lora in lora_model.loras.values():
            lora.optimize()
        logger.info("Loaded in-memory LoRA %d with %d weight groups", lora_model.id, len(lora_model.loras))
        return lora_model, peft_helper

    def binding(self, adapter_id: int) -> tuple[list[str], list[str]]:
        """Probe adapter ``adapter_id``: (LoRA layers that receive its weights, its weight names used by none)."""
        lora_model = self._registered_adapters.get(adapter_id)
        if lora_model is None:
            raise KeyError(f"LoRA adapter {adapter_id} is not registered; have {sorted(self._registered_adapters)}")
        bound, used = [], set()
        for name, layer in self._lora_modules.items():
            found = self._weights_for(lora_model, name, layer)
            if found:
                bound.append(name)
                used.update(id(w) for w in found)
        unused = sorted(key for key, weights in lora_model.loras.items() if id(weights) not in used)
        return bound, unused

    def _weights_for(self, lora_model: LoRAModel, name: str, layer: Any) -> list[Any]:
        """The adapter weights the manager would activate on layer ``name`` (packed layers: per slice)."""
        weights = self._get_lora_weights(lora_model, name)
        if weights is not None:
            return [weights]
        n_slices = getattr(layer, "n_slices", 1)
        if n_slices <= 1:
            return []
        prefix, _, suffix = name.rpartition(".")
        subs = self._get_packed_sublayer_suffixes(suffix, n_slices) or []
        found = [self._get_lora_weights(lora_model, f"{prefix}.{sub}" if prefix else sub) for sub in subs]
        return [w for w in found if w is not None]

"""Worker extension of the vLLM-Omni diffusion worker for rollouts.

Installed through ``worker_extension_cls``; vLLM-Omni mixes it into its worker class, so its
methods are callable through ``AsyncOmni.collective_rpc``. It keeps the custom-pipeline
re-initialisation of vLLM-Omni's ``CustomPipelineWorkerExtension`` and, at worker start, builds
the LoRA manager that accepts in-memory tensors.
"""

from __future__ import annotations

import logging

from vllm_omni.diffusion.worker.diffusion_worker import CustomPipelineWorkerExtension

from verl_omni.workers.rollout.vllm_omni.lora import TensorLoRAManager, TensorLoRARequest

logger = logging.getLogger(__name__)


class OmniRolloutWorkerExtension(CustomPipelineWorkerExtension):
    """Rollout RPCs on the diffusion worker (see module docstring)."""

    def init_lora_manager(self) -> None:
        if self.model_runner.pipeline is None:
            return
        self.lora_manager = TensorLoRAManager(
            pipeline=self.model_runner.pipeline,
            device=self.device,
            dtype=self.od_config.dtype,
            max_cached_adapters=self.od_config.max_cpu_loras,
            lora_path=self.od_config.lora_path,
            lora_scale=self.od_config.lora_scale,
        )

    def verl_omni_add_lora(self, fields: dict) -> list[bool]:
        """Register the in-memory adapter given by ``TensorLoRARequest`` fields (see ``OmniRolloutEngine``)."""
        return [self.lora_manager.add_adapter(TensorLoRARequest(**fields))]

    def verl_omni_lora_binding(self, adapter_id: int) -> list[dict]:
        """Probe adapter ``adapter_id``: the LoRA layers it binds to and its weights that bind to none."""
        bound, unused = self.lora_manager.binding(adapter_id)
        return [{"bound": bound, "unused": unused}]

    def verl_omni_request_batch_sizes(self) -> list[int]:
        """Requests per transformer batch of every rollout forward so far, in order."""
        return list(getattr(self.model_runner.pipeline, "request_batch_sizes", []))

    def verl_omni_load_weights(self, weights: list) -> list[int]:
        """Load full weights ``[(pipeline-prefixed name, tensor)]``; returns how many parameters were set."""
        loaded = self.model_runner.pipeline.load_weights(iter(weights))
        if not loaded:
            names = [name for name, _ in weights[:4]]
            raise ValueError(f"no pipeline parameter matched the pushed weights (names like {names})")
        return [len(loaded)]

"""Worker extension of the vLLM-Omni diffusion worker for rollouts.

Installed through ``worker_extension_cls``; vLLM-Omni mixes it into its worker class, so its
methods are callable through ``AsyncOmni.collective_rpc``. It keeps the custom-pipeline
re-initialisation of vLLM-Omni's ``CustomPipelineWorkerExtension`` and, at worker start, builds
the LoRA manager that accepts in-memory tensors; it also receives full weights in checked buckets
(:mod:`~verl_omni.workers.rollout.weight_buckets`), and joins the weight group through which actor rank 0
broadcasts them between separate pools (:mod:`~verl_omni.workers.rollout.collective_share`).
"""

from __future__ import annotations

import logging

import torch
from vllm_omni.diffusion.worker.diffusion_worker import CustomPipelineWorkerExtension

from verl_omni.workers.rollout import collective_share, device_share
from verl_omni.workers.rollout.vllm_omni.lora import TensorLoRAManager, TensorLoRARequest
from verl_omni.workers.rollout.weight_buckets import WeightBucket, WeightSyncError, WeightSyncReceiver

# the name part vLLM-Omni's LoRA layer wrappers put before a wrapped layer's own parameters
LORA_BASE_LAYER = ".base_layer."

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
        """Register the in-memory adapter given by ``TensorLoRARequest`` fields (see ``OmniRolloutEngine``); its
        tensors come as ``lora_tensors`` on the host or as ``shared_tensors`` opened here by CUDA IPC and copied
        on this GPU (the sender frees its buffer once the sync is over), or as ``broadcast_tensors`` received here
        from the weight group (the adapter's tensors are views of this worker's own buffer)."""
        fields = dict(fields)
        shared = fields.pop("shared_tensors", None)
        broadcast = fields.pop("broadcast_tensors", None)
        if shared is not None:
            views = device_share.open_shared(shared)
            fields["lora_tensors"] = {name: view.clone() for name, view in views.items()}
            del views
            torch.cuda.synchronize()
        elif broadcast is not None:
            buffer = collective_share.receive(self._weight_group(), broadcast, self.device)
            fields["lora_tensors"] = collective_share.open_received(buffer, broadcast)
        return [self.lora_manager.add_adapter(TensorLoRARequest(**fields))]

    def verl_omni_lora_binding(self, adapter_id: int) -> list[dict]:
        """Probe adapter ``adapter_id``: the LoRA layers it binds to and its weights that bind to none."""
        bound, unused = self.lora_manager.binding(adapter_id)
        return [{"bound": bound, "unused": unused}]

    def verl_omni_request_batch_sizes(self) -> list[int]:
        """Requests per transformer batch of every rollout forward so far, in order."""
        return list(getattr(self.model_runner.pipeline, "request_batch_sizes", []))

    # ---- the weight group (verl_omni.workers.rollout.collective_share) ----------------------------

    def verl_omni_worker_rank(self) -> list[int]:
        """This worker's rank in its stage (the engine counts its workers with it)."""
        return [self.rank]

    def verl_omni_join_weight_group(self, group: collective_share.WeightGroup, first_rank: int) -> list[dict]:
        """Join ``group`` as member ``first_rank`` + this worker's rank (while the sender and every other worker
        join), on this worker's device; kept for every later sync."""
        self._weight_group_member = collective_share.join(group, first_rank + self.rank, self.device)
        return [{}]

    def _weight_group(self):
        member = getattr(self, "_weight_group_member", None)
        if member is None:
            raise RuntimeError("this rollout worker has not joined a weight group (join_weight_group runs first)")
        return member

    # ---- full-weight sync (verl_omni.workers.rollout.weight_buckets) ---------------------------

    def verl_omni_begin_weight_sync(self, version: int, count: int, prefix: str, complete: bool = True) -> list[dict]:
        """Open sync ``version`` of ``count`` buckets whose names the pipeline loads under ``prefix``
        (its component, e.g. ``transformer.``); ``complete``: every parameter of that component must be written,
        else (the merged LoRA's adapted linears) every name sent must set one."""
        pipeline = self.model_runner.pipeline
        component = getattr(pipeline, prefix.rstrip("."), None)
        if component is None:
            return [{"error": f"the rollout pipeline {type(pipeline).__name__} has no component {prefix!r}"}]

        wrapped = sorted(name for name, _ in component.named_parameters() if LORA_BASE_LAYER in name)
        if wrapped:
            # vLLM-Omni's LoRA manager wraps a layer the first time an adapter binds to it and keeps the wrapper
            # after the adapter is removed; the pipeline's load_weights does not reach a wrapped layer's base
            # weights, so a full-weight sync would leave them stale
            return [
                {
                    "error": f"full-weight sync into a rollout whose {prefix.rstrip('.')} carries LoRA layers "
                    f"({len(wrapped)} parameters such as {wrapped[:2]}): this engine served a LoRA before. Full "
                    "fine-tuning (actor_rollout_ref.model.lora.rank=0) syncs into an engine that never loaded one"
                }
            ]

        def load(weights):
            return pipeline.load_weights((f"{prefix}{name}", tensor) for name, tensor in weights)

        def expected():
            return {f"{prefix}{name}" for name, _ in component.named_parameters()}

        self._weight_sync = WeightSyncReceiver(load, expected if complete else None)
        return self._sync_call(lambda: self._weight_sync.begin(version, count))

    def verl_omni_load_weight_bucket(self, fields: dict) -> list[dict]:
        """Check and load one :class:`WeightBucket` (given as its ``to_fields``). A broadcast bucket's buffer is
        received first, before any check: the sender's broadcast waits for every worker."""
        bucket = WeightBucket(**fields)
        received = None
        if bucket.broadcast is not None:
            received = collective_share.receive(self._weight_group(), bucket.broadcast, self.device)
        return self._sync_call(lambda: {"loaded": self._receiver().receive(bucket, received)})

    def verl_omni_finish_weight_sync(self, version: int) -> list[dict]:
        """Close sync ``version``: ``{"buckets", "bytes", "params"}`` or ``{"error"}`` (a bucket lost or unloaded)."""
        return self._sync_call(lambda: self._receiver().finish(version))

    def _receiver(self) -> WeightSyncReceiver:
        receiver = getattr(self, "_weight_sync", None)
        if receiver is None:
            raise WeightSyncError("no weight sync was begun in this rollout worker")
        return receiver

    @staticmethod
    def _sync_call(call) -> list[dict]:
        """The call's result as a one-worker list; a failed check comes back as ``{"error"}`` for the engine to raise."""
        try:
            return [call() or {}]
        except WeightSyncError as error:
            return [{"error": str(error)}]

"""``DiffusionActorWorker``: the single-controller worker of the actor (and its reference), for any algorithm.

It subclasses verl's ``TrainingWorker``, which already builds the engine from the registry
(``model_type="diffusion_model"`` → ``DiffusersFSDPEngine``), sets up profiling and dispatch and
forwards save/load checkpoint and offload to the engine. On top it exposes the actor's phases
as DataProto methods split over the data-parallel ranks (``DP_COMPUTE_PROTO``):
``compute_log_prob`` (old policy), ``compute_ref_log_prob`` (reference μ: LoRA disabled, or the
frozen base copy of full fine-tuning), ``update_actor``, ``get_lora_params`` (LoRA tensors for the
rollout; ``share_lora_params`` shares them on the GPU by CUDA IPC instead, ``stage_lora_params`` packs them for
a broadcast to separate pools) and, for full fine-tuning, ``weight_bucket_plan`` / ``get_weight_bucket`` (the
transformer, or the EMA of its weights, in checked buckets, :mod:`~verl_omni.workers.rollout.weight_buckets`).
Rank 0 is the sender of the weight group (``open_weight_group`` / ``join_weight_group`` / ``send_staged``,
:mod:`~verl_omni.workers.rollout.collective_share`) when the rollout runs on GPUs of its own.

The rollout is not inside this worker: it runs in vLLM-Omni servers of its own, and the reference
lives in the actor's engine, so one worker covers verl's actor and ref roles.

A ``DataProto`` sent to these methods carries per-sample tensors (``docs/design.md``, "The actor's batch")
and ``meta_info["sampling_spec"]``, a :class:`~verl_omni.pipelines.sampling.SamplingSpec` as a dict.
"""

from __future__ import annotations

import logging
import os

import ray
import torch
import torch.distributed as dist
from verl import DataProto
from verl.single_controller.base.decorator import Dispatch, register
from verl.utils.device import get_device_name
from verl.workers.engine_workers import TrainingWorker

import verl_omni.workers.engine.fsdp.diffusers_impl  # noqa: F401  (registers DiffusersFSDPEngine)
from verl_omni.algorithms import AlgorithmConfig
from verl_omni.pipelines.sampling import SamplingSpec
from verl_omni.workers.actor.diffusion_actor import DiffusionActor
from verl_omni.workers.config.actor import DiffusionActorConfig
from verl_omni.workers.config.rollout import COLLECTIVE, IPC
from verl_omni.workers.engine.fsdp import policy_versions
from verl_omni.workers.engine.fsdp.diffusers_impl import SAMPLING_SPEC_KEY, compiled_graph_count
from verl_omni.workers.rollout import collective_share, device_share
from verl_omni.workers.rollout.weight_buckets import WeightBucket
from verl_omni.workers.utils.losses import run_algorithm

logger = logging.getLogger(__name__)

# which of the old policy's replay outputs ``compute_log_prob`` returns (the algorithm's ``Phases.old_outputs``)
OLD_OUTPUTS_KEY = "old_outputs"
# the weight version ``compute_log_prob`` replays (one kept with ``keep_policy_version``); absent: the current weights
POLICY_VERSION_KEY = "policy_version"


def _init_cpu_process_group() -> None:
    """Plain gloo before verl's own init, which would ask for ``"cpu:gloo,cpu:gloo"`` on CPU (docs/design.md, "verl on
    the CPU")."""
    if get_device_name() == "cpu" and not dist.is_initialized():
        dist.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))


def _sampling_spec(data: DataProto) -> SamplingSpec:
    spec = data.meta_info.get(SAMPLING_SPEC_KEY)
    if spec is None:
        raise KeyError(f"DataProto.meta_info[{SAMPLING_SPEC_KEY!r}] is required: the rollout's sampling settings")
    return SamplingSpec.from_dict(spec)


class DiffusionActorWorker(TrainingWorker):
    """Actor + reference on a ``DiffusersFSDPEngine`` (one Ray actor per rank); the loss is the algorithm's."""

    def __init__(self, config, actor_config: DiffusionActorConfig, algorithm_config: AlgorithmConfig):
        """``algorithm_config``: the run's ``algorithm`` node (required: the worker never picks an algorithm)."""
        self.algorithm = run_algorithm(algorithm_config, "DiffusionActorWorker")
        _init_cpu_process_group()
        super().__init__(config)
        self.actor_config = actor_config
        self.algorithm_config = algorithm_config
        self.actor: DiffusionActor | None = None
        # earlier weight versions still needed (separate_async): version -> this rank's trainable shards on the host
        self.policy_versions: dict[int, dict] = {}
        # device buffers the rollout reads by CUDA IPC during a sync (device_share), dropped by release_shared
        self._shared_buffers: list = []
        # rank 0, separate pools: its end of the weight group (collective_share), made at the first sync
        self._sender: collective_share.CollectiveSender | None = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        """Build the sharded model, optimizer and schedule on every rank."""
        phases = self.algorithm.phases(self.algorithm_config, self.actor_config)
        # the old policy as a second adapter must exist before FSDP wraps the module
        self.engine.old_policy_adapter = phases.old_policy_adapter
        # full fine-tuning's reference is a frozen copy: built only when a KL term needs it
        self.engine.needs_reference = phases.reference
        # the reference velocity beside the trained one in the update's replay (Diffusion-DPO)
        self.engine.reference_in_update = phases.reference_in_update
        # full fine-tuning's EMA of the weights (validation and export), built with the sharded model
        self.engine.ema_decay = self.actor_config.ema_decay
        self.engine.initialize()
        self.actor = DiffusionActor(self.engine, self.actor_config, self.algorithm_config)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """The old policy's replay outputs named in ``meta_info["old_outputs"]`` (default ``["log_probs"]``), each
        as ``old_<name>`` (``old_log_probs`` ``[B, W]``, ``old_prev_sample_mean`` ``[B, W, N, C]``); with
        ``meta_info["policy_version"]``, of that kept weight version instead of the current weights."""
        version = data.meta_info.get(POLICY_VERSION_KEY)
        if version is None:
            out = self.actor.infer(data.batch, _sampling_spec(data))
        else:
            if version not in self.policy_versions:
                raise KeyError(
                    f"compute_log_prob of weight version {version}: the actor keeps {sorted(self.policy_versions)} "
                    "(keep_policy_version must run before the update that replaces it)"
                )
            with policy_versions.weights_of(self.engine.module, self.policy_versions[version]):
                out = self.actor.infer(data.batch, _sampling_spec(data))
        names = data.meta_info.get(OLD_OUTPUTS_KEY, ["log_probs"])
        return DataProto.from_dict(tensors={f"old_{name}": out[name] for name in names})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """``ref_prev_sample_mean`` ``[B, W, N, C]``: the reference's means, for the KL term."""
        means = self.actor.compute_ref_prev_sample_mean(data.batch, _sampling_spec(data))
        return DataProto.from_dict(tensors={"ref_prev_sample_mean": means})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_actor(self, data: DataProto) -> DataProto:
        """One update with the algorithm's loss; ``meta_info["metrics"]`` (verl gathers one value per rank; they are equal,
        being reduced over ranks in the actor already)."""
        metrics = self.actor.update_policy(data.batch, _sampling_spec(data))
        graphs = compiled_graph_count()
        if graphs is not None:
            # grows in the steps that compiled (the first, and one whose text length is new): not steady steps
            metrics["perf/actor_compiled_graphs"] = graphs
        if get_device_name() == "cuda":
            # this rank's peak since it started (the frozen base, the LoRA or full weights, optimizer, activations)
            metrics["perf/actor_max_memory_allocated_gb"] = torch.cuda.max_memory_allocated() / 2**30
            metrics["perf/actor_max_memory_reserved_gb"] = torch.cuda.max_memory_reserved() / 2**30
        return DataProto(meta_info={"metrics": metrics})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def keep_policy_version(self, version: int, keep: list[int]) -> None:
        """Keep the current trained weights as ``version`` when ``keep`` names it, and drop every kept version
        ``keep`` does not name (separate_async: ``keep`` = the versions queued batches were sampled with)."""
        if version in keep and version not in self.policy_versions:
            self.policy_versions[version] = policy_versions.trainable_shards(self.engine.module)
        self.policy_versions = {v: shards for v, shards in self.policy_versions.items() if v in keep}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def get_lora_params(self) -> tuple[dict, dict]:
        """``(tensors, peft_config)`` of the current LoRA, full tensors on CPU; every rank returns them."""
        params, config = self.engine.get_per_tensor_param()
        return dict(params), config

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def weight_bucket_plan(self, bucket_bytes: int) -> list[list[str]]:
        """Full fine-tuning: the transformer's tensor names in buckets of at most ``bucket_bytes`` (same on every rank)."""
        return self.engine.weight_bucket_plan(bucket_bytes)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def get_weight_bucket(
        self, plan: list[list[str]], version: int, index: int, ema: bool = False, transport: str = "host"
    ) -> WeightBucket | None:
        """Bucket ``index`` of sync ``version`` (``ema``: of the EMA weights), checksummed; every rank gathers its
        shards, rank 0 returns it (non-blocking: the caller hands rank 0's object reference to the rollout servers,
        the bucket never passes through the trainer process). The ``transport`` (``weight_sync``) decides the
        form: ``ipc``: every rank packs it on its GPU and returns its CUDA IPC handle (``device_share``), keeping
        this bucket and the one before alive (the rollout loads one while the next is gathered) until
        :meth:`release_shared`; ``collective``: rank 0 packs it for :meth:`send_staged` and returns its layout."""
        tensors = self.engine.weight_bucket(plan, index, ema=ema, to_host=transport not in (IPC, COLLECTIVE))
        if transport == IPC:
            handle, buffer = device_share.share(tensors, self._device())
            self._shared_buffers = [*self._shared_buffers[-1:], buffer]
            return WeightBucket.shared_build(version, index, len(plan), handle)
        if dist.get_rank() != 0:
            return None
        if transport == COLLECTIVE:
            return WeightBucket.broadcast_build(version, index, len(plan), self._weight_sender().stage(tensors))
        return WeightBucket.build(version, index, len(plan), tensors)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def share_lora_params(self) -> tuple[device_share.SharedTensors, dict]:
        """``(handle, peft_config)``: the current LoRA packed on this rank's GPU for the colocated rollout to open by
        CUDA IPC (``device_share``); every rank shares its own copy, kept until :meth:`release_shared`."""
        params, config = self.engine.get_per_tensor_param(to_host=False)
        handle, buffer = device_share.share(dict(params), self._device())
        self._shared_buffers = [buffer]
        return handle, config

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def stage_lora_params(self) -> tuple[collective_share.BroadcastTensors | None, dict]:
        """``(layout, peft_config)``: the current LoRA packed on rank 0's device for :meth:`send_staged` (every rank
        gathers; the others return no layout)."""
        params, config = self.engine.get_per_tensor_param(to_host=False)
        if dist.get_rank() != 0:
            return None, config
        return self._weight_sender().stage(dict(params)), config

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def open_weight_group(self, size: int) -> collective_share.WeightGroup | None:
        """Rank 0 hosts the weight group's store for ``size`` members and returns where to join (once per run)."""
        if dist.get_rank() != 0:
            return None
        self._sender = collective_share.CollectiveSender(size, self._device(), ray.util.get_node_ip_address())
        return self._sender.group

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def join_weight_group(self) -> None:
        """Rank 0 joins as member 0 (non-blocking: the rollout workers join meanwhile)."""
        if self._sender is not None:
            self._sender.connect()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def send_staged(self) -> int:
        """Rank 0 broadcasts its oldest staged buffer to the rollout workers; returns its bytes (others: 0).
        Non-blocking: the servers' receiving calls must be in flight at the same time."""
        return self._sender.send() if self._sender is not None else 0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def release_shared(self) -> None:
        """Drop the buffers shared with the rollout (after every server finished reading them), and any staged
        for a broadcast and not sent (a sync that failed half way)."""
        self._shared_buffers = []
        if self._sender is not None:
            self._sender.drop_staged()
        if torch.cuda.is_available():
            torch.cuda.ipc_collect()
            torch.cuda.empty_cache()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def release_device_cache(self) -> float:
        """Give the blocks this rank's caching allocator keeps free back to the device, before a colocated rollout
        wakes on it: the actor phases' activations are freed but stay reserved by this process, and the rollout's
        weights need that memory back. Returns the GiB released."""
        if not torch.cuda.is_available():
            return 0.0
        reserved = torch.cuda.memory_reserved()
        torch.cuda.empty_cache()
        return (reserved - torch.cuda.memory_reserved()) / 2**30

    def _weight_sender(self) -> collective_share.CollectiveSender:
        if self._sender is None:
            raise RuntimeError("actor rank 0 has no weight group: open_weight_group runs before the first broadcast")
        return self._sender

    @staticmethod
    def _device() -> torch.device:
        if get_device_name() == "cpu":
            return torch.device("cpu")
        return torch.device(get_device_name(), torch.cuda.current_device())

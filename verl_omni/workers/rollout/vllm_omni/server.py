"""verl rollout server and replica for vLLM-Omni diffusion models (rollout name ``vllm_omni``).

``vLLMOmniHttpServer`` keeps verl's ``vLLMHttpServer`` Ray-actor surface (addresses, profiling,
abort/resume, sleep/wake) and swaps the text engine for :class:`OmniRolloutEngine` running our
log-prob pipeline. There is no HTTP endpoint: callers use the actor methods ``generate`` and
``generate_batched``; ``get_server_address`` reports port 0.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import ray
import torch
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from verl.single_controller.base import Worker
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool
from verl.utils.device import get_device_name
from verl.workers.rollout.replica import RolloutMode
from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica

from verl_omni.workers.config.rollout import replica_world_size, sequence_parallel_size
from verl_omni.workers.rollout.vllm_omni.engine import OmniRolloutEngine
from verl_omni.workers.rollout.vllm_omni.schemas import DiffusionOutput, own_storage

logger = logging.getLogger(__name__)

DEFAULT_MAX_BATCH_REQUESTS = 8
# On CPU a request's numbers depend on the transformer batch it shares: small-row matmuls round
# differently with the row count (the tiny Qwen-Image's outputs move by ~4e-7 between batches of 1, 2
# and 4 samples), and which requests share a batch depends on arrival timing. One request per batch
# makes CPU runs, and resumed runs, bit-reproducible (docs/guide/reliability.md, "Output directory and resume").
CPU_MAX_BATCH_REQUESTS = 1
# Ray CPUs a CPU-only server actor reserves (its engine's worker processes run outside Ray)
CPU_SERVER_NUM_CPUS = 1


def failed_acks(acks: list | None, replica_rank: int, action: str) -> None:
    """Raise when a worker's sleep or wake-up ACK says it failed. vLLM-Omni's workers log the failure and answer
    with an ``ERROR`` ACK instead of raising, so a wake-up that ran out of device memory would surface later as
    an unrelated CUDA error in the next weight load, into memory that was never mapped back."""
    # a worker's failure path builds its ACK without its rank
    errors = [
        f"{'a worker' if ack.rank is None else f'rank {ack.rank}'}: {ack.error_msg}"
        for ack in acks or []
        if getattr(ack, "status", None) == "ERROR"
    ]
    if not errors:
        return
    hint = ""
    if action == "wake-up" and any("out of memory" in error for error in errors):
        hint = (
            ": the rollout's weights do not fit beside what the colocated actor keeps on the device between its "
            "phases; offload the actor between them (actor_rollout_ref.actor.engine.param_offload=true and "
            "optimizer_offload=true)"
        )
    raise RuntimeError(f"rollout replica {replica_rank}: {action} failed on {'; '.join(errors)}{hint}")


def _engine_dtype(config_dtype: str, model_path: str) -> str:
    """The dtype the model's pipeline requires (its adapter's ``rollout_dtype``), else fp32 on CPU (no bf16
    kernels worth using there) and the configured dtype on an accelerator."""
    from verl_omni.pipelines.model_base import get_model_adapter

    required = get_model_adapter(model_path).rollout_dtype
    if required is not None:
        return required
    return config_dtype if torch.cuda.is_available() else "float32"


def _engine_bounds(config) -> dict:
    """The engine's warm-up size (the rollout's image size), start-up and generation bounds from a diffusion
    rollout config; a plain verl ``RolloutConfig`` has none of them and keeps the engine's defaults."""
    settings = {}
    if getattr(config, "height", None) and getattr(config, "width", None):
        settings["warmup_size"] = (int(config.height), int(config.width))
    for key in ("engine_start_timeout_s", "generation_timeout_s"):
        if getattr(config, key, None) is not None:
            settings[key] = float(getattr(config, key))
    return settings


class vLLMOmniHttpServer(vLLMHttpServer):  # noqa: N801 (verl's naming)
    """A vLLM-Omni diffusion rollout server in one node (see module docstring)."""

    def _init_model_config(self, model_config):
        """Diffusion checkpoints have no transformers config: keep the given model config (needs ``path``)."""
        if not (getattr(model_config, "local_path", None) or getattr(model_config, "path", None)):
            raise ValueError("model_config.path must point at a diffusers-format model directory")
        return model_config

    def _validate_configs(self) -> None:
        """The text-model limits verl checks (max_model_len, batched tokens) do not apply to diffusion."""

    async def launch_server(self, master_address: str = None, master_port: int = None, dp_rpc_port: int = None):
        if self.node_rank != 0:
            return
        # may name the rollout pipeline (custom_pipeline) and a stage/deploy config (stage_configs_path)
        engine_kwargs = dict((self.config.get("engine_kwargs", {}) or {}).get("vllm_omni", {}) or {})
        # rollout.max_num_seqs defaults to 1024 for text; a diffusion batch is images: own, small default
        default = DEFAULT_MAX_BATCH_REQUESTS if torch.cuda.is_available() else CPU_MAX_BATCH_REQUESTS
        max_batch_requests = int(engine_kwargs.pop("max_num_seqs", default))
        # the replica's devices split each sample's tokens (rollout.ulysses_sequence_parallel_size, one worker each)
        if sequence_parallel_size(self.config) > 1:
            engine_kwargs["ulysses_degree"] = sequence_parallel_size(self.config)
        if self._sleeps():
            # weights go through vLLM's CuMem pool so that sleep(level=1) can offload them
            engine_kwargs.setdefault("enable_sleep_mode", True)
        model_path = getattr(self.model_config, "local_path", None) or self.model_config.path
        self.omni = OmniRolloutEngine(
            str(model_path),
            dtype=_engine_dtype(self.config.dtype, str(model_path)),
            max_batch_requests=max_batch_requests,
            **_engine_bounds(self.config),
            **engine_kwargs,
        )
        # AsyncOmni starts its orchestrator on the running loop: build it here, in the actor's loop.
        self.omni.start()
        self.engine = self.omni.engine
        self._inflight: set[str] = set()
        self._asleep = False
        self._server_port = 0

    async def shutdown(self) -> None:
        """Stop the engine and its worker processes."""
        self.omni.shutdown()

    async def _engine_call(self, request_id: str, num_outputs_per_prompt: int, **kwargs) -> list[DiffusionOutput]:
        """The single path to the engine; ``generate`` and ``generate_batched`` both go through it. Its samples
        leave this actor through Ray's pickle, each in its own memory (:func:`own_storage`)."""
        if not isinstance(num_outputs_per_prompt, int) or num_outputs_per_prompt < 1:
            raise ValueError(f"num_outputs_per_prompt must be an int >= 1, got {num_outputs_per_prompt!r}")
        await self._resume_event.wait()
        self._inflight.add(request_id)
        try:
            outputs = await self.omni.engine_call(
                request_id=request_id, num_outputs_per_prompt=num_outputs_per_prompt, **kwargs
            )
            return own_storage(outputs)
        finally:
            self._inflight.discard(request_id)

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: list[Any] | None = None,
        video_data: list[Any] | None = None,
        negative_prompt_ids: list[int] | None = None,
        lora_request: Any = None,
        lora_scale: float | None = None,
        **kwargs: Any,
    ) -> DiffusionOutput:
        """One sample for ``prompt_ids`` (the N=1 case of :meth:`generate_batched`)."""
        (output,) = await self.generate_batched(
            prompt_ids,
            sampling_params,
            request_id,
            num_outputs_per_prompt=1,
            negative_prompt_ids=negative_prompt_ids,
            lora_request=lora_request,
            lora_scale=lora_scale,
            image_data=image_data,
        )
        return output

    async def generate_batched(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        num_outputs_per_prompt: int,
        negative_prompt_ids: list[int] | None = None,
        lora_request: Any = None,
        lora_scale: float | None = None,
        image_data: list[Any] | None = None,
        **kwargs: Any,
    ) -> list[DiffusionOutput]:
        """``num_outputs_per_prompt`` samples of one prompt from one engine request (one transformer batch).

        ``prompt_ids`` / ``negative_prompt_ids`` keep verl's server argument names; inside the rollout
        path they are ``prompt_token_ids``, as vLLM names them. ``lora_request`` / ``lora_scale`` select
        an adapter for this request only (default: the adapter pushed with :meth:`load_lora_tensors`).
        ``image_data`` (verl's name): the prompt's source images, sent once for the request's samples.
        Each output's ``extra_fields["request_id"]`` is the id this server ran the request under.
        """
        outputs = await self._engine_call(
            request_id,
            num_outputs_per_prompt,
            prompt_token_ids=prompt_ids,
            sampling_params=sampling_params,
            negative_prompt_token_ids=negative_prompt_ids,
            lora_request=lora_request,
            lora_scale=lora_scale,
            image_data=image_data,
        )
        for output in outputs:
            output.extra_fields["request_id"] = request_id
        return outputs

    async def request_batch_sizes(self) -> list[int]:
        """Requests per transformer batch of every rollout forward of this server's engine so far."""
        return await self.omni.request_batch_sizes()

    async def load_lora_tensors(
        self, peft_config: dict[str, Any], tensors: dict[str, torch.Tensor] | None = None, shared=None, broadcast=None
    ) -> int:
        """Push an in-memory LoRA adapter, as host ``tensors``, as CUDA IPC handles ``shared`` (one per sender GPU,
        ``device_share``) or as the layout of the buffer broadcast through the weight group (``collective_share``);
        returns how many modules it binds (never 0: that raises)."""
        return len(await self.omni.load_lora_tensors(peft_config, tensors, shared, broadcast))

    async def worker_count(self) -> int:
        """This replica's rollout worker processes (members of the weight group, ``collective_share``)."""
        return await self.omni.worker_count()

    async def join_weight_group(self, group, first_rank: int) -> None:
        """Join the weight group: the workers as members ``first_rank``, ``first_rank + 1``, ..."""
        await self.omni.join_weight_group(group, first_rank)

    async def begin_weight_sync(self, version: int, count: int, complete: bool = True) -> None:
        """Open weight sync ``version`` of ``count`` buckets (``weight_sync.BucketPayload``); ``complete``: of
        the whole transformer, else of the merged LoRA's linears."""
        await self.omni.begin_weight_sync(version, count, complete)

    async def load_weight_bucket(self, bucket) -> int:
        """Check and load one bucket of the open sync; returns how many rollout names it set."""
        return await self.omni.load_weight_bucket(bucket)

    async def finish_weight_sync(self, version: int) -> dict[str, int]:
        """Close the sync; raises unless every bucket arrived intact and every transformer parameter was written."""
        return await self.omni.finish_weight_sync(version)

    def _sleeps(self) -> bool:
        """Whether this server gives its device memory back during the actor phases.

        Only a server on the actor's devices (colocated) with ``free_cache_engine`` on an
        accelerator; a standalone server owns its devices, and on CPU nothing is offloaded.
        """
        return (
            self.node_rank == 0
            and self.rollout_mode != RolloutMode.STANDALONE
            and bool(self.config.free_cache_engine)
            and torch.cuda.is_available()
        )

    async def wake_up(self, tags: list[str] | None = None):
        if self._sleeps() and self._asleep:
            failed_acks(await self.engine.wake_up(), self.replica_rank, "wake-up")
            self._asleep = False

    async def sleep(self):
        if self._sleeps() and not self._asleep:
            await self.wait_for_requests_to_drain()
            free_before = torch.cuda.mem_get_info()[0]
            # level 1 moves the weights to host memory and restores them on wake-up (level 2 drops them)
            failed_acks(await self.engine.sleep(level=1), self.replica_rank, "sleep")
            self._asleep = True
            freed = (torch.cuda.mem_get_info()[0] - free_before) / 2**30
            logger.info("rollout replica %d asleep: %.1f GiB of device memory freed", self.replica_rank, freed)

    async def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool = False) -> dict[str, Any]:
        request_ids = sorted(self._inflight)
        if request_ids:
            await self.omni.abort(request_ids)
        return {"aborted_count": len(request_ids), "request_ids": request_ids}

    async def abort_request(self, request_id: str, reset_prefix_cache: bool = True) -> dict[str, Any]:
        if request_id not in self._inflight:
            return {"aborted": False, "request_id": request_id}
        await self.omni.abort([request_id])
        return {"aborted": True, "request_id": request_id}

    async def resume_generation(self):
        self._resume_event.set()

    async def wait_for_requests_to_drain(self):
        while self._inflight:
            await asyncio.sleep(0.05)

    # a diffusion engine has no KV cache, prefix cache or encoder cache
    async def clear_kv_cache(self):
        return None

    async def release_kv_cache(self):
        return None

    async def resume_kv_cache(self):
        return None


class RolloutDeviceHolder(Worker):
    """What a standalone replica places on each of its GPUs: verl's standalone replica (separate pools) puts one
    worker per GPU, to hold the device's bundle and tell the server its node and device id. verl's own worker there
    (``CheckpointEngineWorker``) also builds a rollout adapter for verl's weight-update path, and finds none for
    ``vllm_omni`` (the run stopped at start: "Rollout vllm_omni with mode async not found"); the diffusion rollout
    takes its weights through its server (``weight_sync``), so the holder does nothing else."""


class vLLMOmniReplica(vLLMReplica):  # noqa: N801 (verl's naming)
    """A verl rollout replica whose servers are :class:`vLLMOmniHttpServer` actors.

    On a machine without an accelerator (verl's platform is ``cpu``), verl's replica would ask Ray
    for GPU bundles (standalone) or read the workers' GPU ids (hybrid) and fail; there the replica
    starts its one server actor directly (CPUs only; the engine runs in the server's own worker
    processes in every mode).
    The replica's server address is its server actor's name: the server has no HTTP endpoint and
    every replica reports port 0, so ``host:port`` would not tell replicas apart.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.server_class = ray.remote(vLLMOmniHttpServer)
        self._count_sequence_parallel_devices()

    def _count_sequence_parallel_devices(self) -> None:
        """verl's ``RolloutReplica.__init__`` sizes a replica as tp x dp x pp devices; a diffusion replica's engine
        also splits each sample over ``ulysses_sequence_parallel_size`` workers, one per device, so its size (and
        the nodes and devices per node that follow from it) counts those too."""
        self.world_size = replica_world_size(self.config)
        self.gpus_per_replica_node = min(self.gpus_per_node, self.world_size)
        if self.world_size % self.gpus_per_replica_node:
            raise ValueError(
                f"a rollout replica spans {self.world_size} devices (tensor_model_parallel_size x "
                f"ulysses_sequence_parallel_size of actor_rollout_ref.rollout), which must be a multiple of the "
                f"{self.gpus_per_node} devices per node"
            )
        self.nnodes = self.world_size // self.gpus_per_replica_node

    def _get_server_name_prefix(self) -> str:
        return "vllm_omni_"

    def get_ray_class_with_init_args(self) -> RayClassWithInitArgs:
        """A standalone replica's per-GPU workers: :class:`RolloutDeviceHolder`, not verl's weight-update worker."""
        return RayClassWithInitArgs(cls=ray.remote(RolloutDeviceHolder))

    def _server_name(self, node_rank: int) -> str:
        return f"{self._get_server_name_prefix()}server_{self.replica_rank}_{node_rank}{self.name_suffix}"

    async def init_standalone(self):
        if _on_accelerator():
            return await super().init_standalone()
        self.rollout_mode = RolloutMode.STANDALONE
        await self.launch_servers()

    async def launch_servers(self):
        if _on_accelerator():
            await super().launch_servers()
        else:
            await self._launch_cpu_server()
        self._server_address = self._server_name(0)

    async def _launch_cpu_server(self) -> None:
        """One server actor holding the engine on CPU: no worker group, no GPU bundle. A standalone replica's
        server runs in a resource pool of its own (one CPU bundle), as verl's standalone replicas on GPU do."""
        if self.nnodes != 1:
            raise ValueError(f"a CPU rollout replica runs on one node, got nnodes={self.nnodes}")
        options = {}
        if self.rollout_mode == RolloutMode.STANDALONE:
            pool = RayResourcePool(
                [1], use_gpu=False, max_colocate_count=CPU_SERVER_NUM_CPUS, name_prefix=self._server_name(0) + "_pool"
            )
            (group,) = pool.get_placement_groups(device_name="cpu")
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0)
        server = self.server_class.options(
            name=self._server_name(0), max_concurrency=self.max_concurrency, num_cpus=CPU_SERVER_NUM_CPUS, **options
        ).remote(
            config=self.config,
            model_config=self.model_config,
            rollout_mode=self.rollout_mode,
            workers=[],
            replica_rank=self.replica_rank,
            node_rank=0,
            gpus_per_node=self.gpus_per_replica_node,
            nnodes=1,
            cuda_visible_devices="",
        )
        self.servers = [server]
        await server.launch_server.remote()
        self._server_handle = server


def _on_accelerator() -> bool:
    """verl's platform in this process has a device (``cpu`` is verl_omni's CPU platform)."""
    return get_device_name() != "cpu"

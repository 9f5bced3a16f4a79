"""Config of the diffusion rollout (the ``actor_rollout_ref.rollout`` node with ``name: vllm_omni``).

``DiffusionRolloutConfig`` extends verl's ``RolloutConfig`` with the diffusion sampling keys (it is a
``SamplingSettings``: the keys are that dataclass's fields, defined and documented once), so
verl's replicas, servers and agent-loop manager (which read the text-model keys: ``nnodes``,
``n_gpus_per_node``, ``agent``, ``free_cache_engine``...) keep working on it. Every error names the
full dotted key.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import DictConfig, OmegaConf
from verl.base_config import BaseConfig
from verl.workers.config import RolloutConfig
from verl.workers.config.rollout import AgentLoopConfig

from verl_omni.pipelines.sampling import SamplingSettings, SamplingSpec
from verl_omni.workers.rollout.routing import DEFAULT_ROUTING_CACHE_SIZE, DEFAULT_ROUTING_POLICY, ROUTING_POLICIES

KEY = "actor_rollout_ref.rollout"
# the agent loop a row without ``agent_name`` runs (registered in verl_omni.agent_loop)
DEFAULT_AGENT_LOOP = "diffusion_single_turn"
# Generous for a busy 2-core CPU machine; vLLM-Omni's own bounds are 600 s (orchestrator) / 300 s (stage).
DEFAULT_ENGINE_START_TIMEOUT_S = 1200.0
ENGINE_START_TIMEOUT_KEY = f"{KEY}.engine_start_timeout_s"
# One engine request (a prompt group) runs seconds on CPU and minutes for full-size video; a request that
# has not finished after half an hour is lost, and the step fails naming it instead of waiting forever.
DEFAULT_GENERATION_TIMEOUT_S = 1800.0
GENERATION_TIMEOUT_KEY = f"{KEY}.generation_timeout_s"
WEIGHT_TRANSPORT_KEY = f"{KEY}.weight_transport"
SEQUENCE_PARALLEL_KEY = f"{KEY}.ulysses_sequence_parallel_size"
# how the trained weights reach the rollout (workers/rollout/weight_sync.py): through the host (Ray's object store
# and the engine's RPC), CUDA IPC handles (colocated on CUDA), a broadcast through a process group (separate pools:
# NCCL on CUDA, gloo on CPU); "auto" picks by placement
HOST, IPC, COLLECTIVE = "host", "ipc", "collective"
WEIGHT_TRANSPORTS = ("auto", HOST, IPC, COLLECTIVE)


def _diffusion_agent_config() -> AgentLoopConfig:
    return AgentLoopConfig(num_workers=2, default_agent_loop=DEFAULT_AGENT_LOOP)


@dataclass
class RolloutServerRoutingConfig(BaseConfig):
    """How requests are spread over rollout replicas (``actor_rollout_ref.rollout.server_routing``).

    Args:
        policy (str): a registered routing policy; ``least_images_affinity`` (default) places each
            prompt group on the replica with the fewest images in flight and keeps it there, so the
            group can be generated as one batch and the step's groups spread evenly;
            ``prompt_uid_affinity`` places it by a stable hash of its key instead.
        routing_key_field (str): the batch field whose value is the routing key (``uid``: one per prompt group).
        max_cache_size (int): sticky entries kept (LRU) by sticky policies.
    """

    policy: str = DEFAULT_ROUTING_POLICY
    routing_key_field: str = "uid"
    max_cache_size: int = DEFAULT_ROUTING_CACHE_SIZE

    def __post_init__(self):
        if self.policy not in ROUTING_POLICIES:
            raise ValueError(
                f"actor_rollout_ref.rollout.server_routing.policy={self.policy!r} is unknown; "
                f"available: {', '.join(ROUTING_POLICIES.names())}"
            )
        if not self.routing_key_field:
            raise ValueError(
                "actor_rollout_ref.rollout.server_routing.routing_key_field must be a non-empty field name"
            )
        if self.max_cache_size < 1:
            raise ValueError(
                f"actor_rollout_ref.rollout.server_routing.max_cache_size must be >= 1, got {self.max_cache_size}"
            )


@dataclass
class DiffusionRolloutConfig(RolloutConfig, SamplingSettings):
    """verl's rollout config plus diffusion sampling (Flow-GRPO SDE window, guidance, routing).

    The sampling keys (``height``, ``num_inference_steps``, ``noise_level``, ``sde_window_size``, ...) are the
    fields of :class:`~verl_omni.pipelines.sampling.SamplingSettings`, inherited: their names, defaults and
    meaning are documented there, once. :meth:`sampling_spec` builds the :class:`SamplingSpec` from them, which
    is where they are checked (values here; what the model can honour in ``trainer/config/validation.py``).

    Args:
        negative_prompt (str): the negative prompt when a row has none (``non_tensor_batch["negative_prompt"]``).
        val_noise_level (float): the ``noise_level`` of validation rollouts, in the same range; 0 (default) samples
            the deterministic ODE.
        engine_kwargs (dict): ``vllm_omni``: keyword arguments of the vLLM-Omni engine (``AsyncOmni``), passed
            through. Default ``{"vllm_omni": {}}``.
        enable_batched_diffusion (bool): generate each group of ``n`` rows sharing a prompt with one
            ``generate_batched`` request (one transformer batch). Default True.
        server_routing (RolloutServerRoutingConfig): how requests are spread over replicas.
        engine_start_timeout_s (float): seconds a rollout engine's start may wait for its orchestrator, stages
            and (CPU) the warm-up request's output, which runs at ``height`` x ``width``, one step. Default 1200.
        generation_timeout_s (float): seconds one engine request (one prompt group, or one sample) may take
            before it is aborted and the step fails naming it; raise it for long videos. Default 1800.
        seed (int): (verl's key) base of every sample's seed, derived with the global step and row index; the
            YAML takes the run's seed (``trainer.seed``, ``FlowGRPOTrainerConfig`` says which seeds follow it).
        weight_transport (str): how the trained weights (the LoRA, or full fine-tuning's buckets) reach the rollout
            after each update: ``"auto"`` picks by placement (CUDA IPC colocated on CUDA, ``"collective"`` for
            separate pools on CUDA, ``"host"`` on the CPU); ``"host"``, ``"ipc"`` (needs the rollout colocated on
            CUDA) or ``"collective"`` (needs separate pools; NCCL on CUDA, gloo on the CPU) force one. Default
            ``"auto"``. docs/guide/training.md, "Weight sync to the rollout".
        ulysses_sequence_parallel_size (int): devices that split each sample's tokens inside one replica (vLLM-Omni's
            Ulysses ``ulysses_degree``); a replica then spans ``tensor_model_parallel_size`` x this many devices
            (:func:`replica_world_size`). Default 1. docs/guide/scale.md, "Sequence parallelism in the rollout".
        checkpoint_engine (CheckpointEngineConfig): (verl's node) only ``update_weights_bucket_megabytes`` is read:
            the bucket bound of full fine-tuning's weight sync (``workers/rollout/weight_buckets.py``). Default 2048.
    """

    name: str = "vllm_omni"
    tensor_model_parallel_size: int = 1
    agent: AgentLoopConfig = field(default_factory=_diffusion_agent_config)
    engine_kwargs: dict = field(default_factory=lambda: {"vllm_omni": {}})
    negative_prompt: str = " "
    val_noise_level: float = 0.0
    enable_batched_diffusion: bool = True
    server_routing: RolloutServerRoutingConfig = field(default_factory=RolloutServerRoutingConfig)
    engine_start_timeout_s: float = DEFAULT_ENGINE_START_TIMEOUT_S
    generation_timeout_s: float = DEFAULT_GENERATION_TIMEOUT_S
    weight_transport: str = "auto"
    ulysses_sequence_parallel_size: int = 1

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.server_routing, dict | DictConfig):
            routing = (
                OmegaConf.to_container(self.server_routing)
                if isinstance(self.server_routing, DictConfig)
                else self.server_routing
            )
            routing = {k: v for k, v in routing.items() if k != "_target_"}
            object.__setattr__(self, "server_routing", RolloutServerRoutingConfig(**routing))
        if self.sde_window_range is not None:
            object.__setattr__(self, "sde_window_range", [int(v) for v in self.sde_window_range])
        if isinstance(self.model_kwargs, DictConfig):
            object.__setattr__(self, "model_kwargs", OmegaConf.to_container(self.model_kwargs, resolve=True))
        if not isinstance(self.model_kwargs, dict):
            raise ValueError(f"{KEY}.model_kwargs must be a mapping, got {type(self.model_kwargs).__name__}")
        # the sampling settings' one validation: the spec's (training and validation noise levels)
        self.sampling_spec(validate=False)
        self.sampling_spec(validate=True)
        if self.agent.num_workers < 1:
            raise ValueError(
                f"{KEY}.agent.num_workers must be >= 1 (agent-loop workers drive the requests), got "
                f"{self.agent.num_workers}"
            )
        if self.n < 1:
            raise ValueError(f"{KEY}.n must be >= 1, got {self.n}")
        if self.val_kwargs.n < 1:
            raise ValueError(f"{KEY}.val_kwargs.n must be >= 1, got {self.val_kwargs.n}")
        if not self.engine_start_timeout_s > 0:
            raise ValueError(f"{ENGINE_START_TIMEOUT_KEY} must be > 0 seconds, got {self.engine_start_timeout_s}")
        if not self.generation_timeout_s > 0:
            raise ValueError(f"{GENERATION_TIMEOUT_KEY} must be > 0 seconds, got {self.generation_timeout_s}")
        if self.weight_transport not in WEIGHT_TRANSPORTS:
            raise ValueError(
                f"{WEIGHT_TRANSPORT_KEY} must be one of {WEIGHT_TRANSPORTS}, got {self.weight_transport!r}"
            )
        self._check_sequence_parallel()
        bucket_mb = self.checkpoint_engine.update_weights_bucket_megabytes
        if not isinstance(bucket_mb, int) or bucket_mb < 1:
            raise ValueError(
                f"{KEY}.checkpoint_engine.update_weights_bucket_megabytes must be an integer >= 1 (MB per bucket of "
                f"the full-weight sync), got {bucket_mb!r}"
            )

    def _check_sequence_parallel(self) -> None:
        """The degree is an integer >= 1, set here only: the engine's own ``ulysses_degree`` is this key's."""
        degree = self.ulysses_sequence_parallel_size
        if not isinstance(degree, int) or isinstance(degree, bool) or degree < 1:
            raise ValueError(f"{SEQUENCE_PARALLEL_KEY} must be an integer >= 1, got {degree!r}")
        if "ulysses_degree" in ((self.engine_kwargs or {}).get("vllm_omni") or {}):
            raise ValueError(
                f"{KEY}.engine_kwargs.vllm_omni.ulysses_degree is set by the trainer, which also sizes the replicas "
                f"by it: set {SEQUENCE_PARALLEL_KEY} instead"
            )

    def sampling_spec(self, validate: bool = False, adapter=None, model: str = "") -> SamplingSpec:
        """The :class:`SamplingSpec` of training (``validate=False``) or validation rollouts (``val_noise_level``):
        null guidance resolved to ``adapter``'s defaults and checked against its model when given. Errors name
        the full key."""
        values = self.sampling_settings()
        if validate:
            values["noise_level"] = self.val_noise_level
        try:
            spec = SamplingSpec.resolve(values, adapter, model)
            return spec
        except ValueError as e:
            message = str(e)
            if validate and message.startswith("noise_level"):
                message = f"val_{message}"  # the validation spec's noise level is val_noise_level
            raise ValueError(f"{KEY}.{message}") from None


def sequence_parallel_size(config) -> int:
    """``ulysses_sequence_parallel_size`` of the rollout node ``config`` (a dataclass or a (Hydra) dict config; 1
    where it has none, e.g. a plain verl ``RolloutConfig``)."""
    return int(config.get("ulysses_sequence_parallel_size", 1) or 1)


def replica_world_size(config) -> int:
    """Devices one rollout replica of the node ``config`` spans: verl's tp x dp x pp, times the sequence-parallel
    degree (each of those devices runs one engine worker)."""
    verl_size = config.tensor_model_parallel_size * config.data_parallel_size * config.pipeline_model_parallel_size
    return verl_size * sequence_parallel_size(config)


def weight_transport_for(requested: str, colocated: bool, device: str | None, sequence_parallel: int = 1) -> str:
    """The transport ``rollout.weight_transport`` (``requested``) means for a placement: ``auto`` is CUDA IPC
    colocated on CUDA, a broadcast (NCCL) to separate pools on CUDA, the host on the CPU, where a sync is a small
    part of a step. A forced one that the placement cannot serve is refused; ``device`` None (not resolved yet,
    the config's validation before Ray starts) checks what it can. ``sequence_parallel``: the rollout's
    ``ulysses_sequence_parallel_size``; a broadcast cannot reach a split replica's workers (below)."""
    if requested == IPC and (not colocated or device == "cpu"):
        raise ValueError(
            f"{WEIGHT_TRANSPORT_KEY}=ipc needs the rollout colocated on CUDA (trainer.colocate_rollout=true on "
            f"cuda); this run is {'colocated' if colocated else 'in separate pools'} on {device or 'auto'}: use auto"
        )
    if requested == COLLECTIVE and colocated:
        raise ValueError(
            f"{WEIGHT_TRANSPORT_KEY}=collective needs the rollout on devices of its own "
            "(trainer.colocate_rollout=false); colocated runs use auto (CUDA IPC on CUDA) or host"
        )
    if requested != "auto":
        transport = requested
    elif device != "cuda":
        transport = HOST
    else:
        transport = IPC if colocated else COLLECTIVE
    if transport == COLLECTIVE and sequence_parallel > 1:
        # the weight group numbers each replica's workers by the replies of an engine RPC, and vLLM-Omni's diffusion
        # executor returns only rank 0's reply: a split replica's other workers would join past the group's size
        raise ValueError(
            f"{WEIGHT_TRANSPORT_KEY}={requested} broadcasts to the rollout through a weight group, which cannot "
            f"count the workers of a replica split by {SEQUENCE_PARALLEL_KEY}={sequence_parallel}: set "
            f"{WEIGHT_TRANSPORT_KEY}=host, or colocate the rollout (trainer.colocate_rollout=true, CUDA IPC)"
        )
    return transport

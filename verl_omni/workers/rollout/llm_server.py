"""Launching the diffusion rollout servers and requesting them: ``OmniLLMServerManager`` / ``OmniLLMServerClient``.

The same two roles as verl's ``verl/workers/rollout/llm_server.py``, for ``vllm_omni`` replicas:

* :class:`OmniLLMServerManager` launches ``nnodes * n_gpus_per_node / (tp * sp)`` replicas (standalone, or
  hybrid on a worker group) and one shared :class:`~verl_omni.workers.rollout.routing.OmniRequestLoadBalancer`
  actor configured from ``rollout.server_routing``.
* :class:`OmniLLMServerClient` is what agent loops call: ``generate`` (one sample) and
  ``generate_batched`` (N samples of one prompt, one engine request). Unlike verl's client it
  forwards the caller's ``request_id`` unchanged (request tracing, abort by id), and it routes on
  the caller's ``routing_key`` (the row's ``uid`` by default) and the request's image count, so the
  ``rollout.n`` copies of a prompt land on one replica and the balancer weighs a ``generate_batched``
  of N images as N (``docs/guide/scale.md``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import ray
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.ray_utils import auto_await
from verl.workers.rollout.llm_server import LLMServerClient, LLMServerManager

from verl_omni.workers.config.rollout import RolloutServerRoutingConfig, replica_world_size, sequence_parallel_size
from verl_omni.workers.rollout.routing import OmniRequestLoadBalancer, SealedServer
from verl_omni.workers.rollout.vllm_omni.schemas import DiffusionOutput

logger = logging.getLogger(__name__)


def routing_config(rollout_config) -> RolloutServerRoutingConfig:
    """``rollout.server_routing`` as a dataclass, from a dataclass or a (Hydra) dict config."""
    routing = rollout_config.get("server_routing") if hasattr(rollout_config, "get") else None
    if routing is None:
        return RolloutServerRoutingConfig()
    if isinstance(routing, RolloutServerRoutingConfig):
        return routing
    return omega_conf_to_dataclass(routing, dataclass_type=RolloutServerRoutingConfig)


class OmniLLMServerClient(LLMServerClient):
    """Client of the diffusion rollout servers, shared by every agent loop of a worker.

    Both calls reserve a replica from the load balancer with ``routing_key`` (falling back to the
    request id) and their image count (1, or ``num_outputs_per_prompt``), call the server with the
    caller's ``request_id``, and release the replica. The balancer hands each replica out sealed
    (:class:`~verl_omni.workers.rollout.routing.SealedServer`); the client opens each once.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._opened: dict[SealedServer, object] = {}

    def _vllm_request_id(self, request_id: str) -> str:
        """The id the server sees is the caller's (verl's client replaces it with a fresh uuid)."""
        return request_id

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        negative_prompt_ids: list[int] | None = None,
        routing_key: str | None = None,
        image_data: list[Any] | None = None,
        **kwargs: Any,
    ) -> DiffusionOutput:
        """One sample of ``prompt_ids`` (templated token ids); ``sampling_params`` as in ``rollout_request``;
        ``image_data``: the prompt's source images (an editing model's)."""
        return await self._call(
            "generate",
            request_id,
            routing_key,
            1,
            prompt_ids=prompt_ids,
            sampling_params=sampling_params,
            negative_prompt_ids=negative_prompt_ids,
            image_data=image_data,
        )

    async def generate_batched(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        num_outputs_per_prompt: int,
        negative_prompt_ids: list[int] | None = None,
        routing_key: str | None = None,
        image_data: list[Any] | None = None,
    ) -> list[DiffusionOutput]:
        """``num_outputs_per_prompt`` samples of one prompt from one engine request (one transformer batch);
        ``num_outputs_per_prompt < 1`` is a ``ValueError`` from the balancer, before any replica is reserved."""
        return await self._call(
            "generate_batched",
            request_id,
            routing_key,
            num_outputs_per_prompt,
            prompt_ids=prompt_ids,
            sampling_params=sampling_params,
            num_outputs_per_prompt=num_outputs_per_prompt,
            negative_prompt_ids=negative_prompt_ids,
            image_data=image_data,
        )

    async def _call(self, method: str, request_id: str, routing_key: str | None, num_images: int, **call_kwargs):
        """Reserve a replica for ``routing_key`` and ``num_images`` images, run ``method`` on its server, release it."""
        key = None if routing_key is None else str(routing_key)
        server_id, sealed = await self._acquire_server(request_id, routing_key=key, num_images=num_images)
        try:
            server = self._opened.get(sealed)
            if server is None:
                server = self._opened[sealed] = sealed.open()
            return await getattr(server, method).remote(request_id=self._vllm_request_id(request_id), **call_kwargs)
        finally:
            self._release_server(server_id, request_id=request_id)


class OmniLLMServerManager(LLMServerManager):
    """verl's server manager with ``vllm_omni`` replicas and the routing-key load balancer.

    ``OmniLLMServerManager.create(config, worker_group=None)`` launches the replicas (standalone when
    no worker group is given; on a machine without GPUs no GPU is asked from Ray) and the balancer.
    ``server_handles`` lists the server actors (LoRA pushes go to each), ``get_client()`` returns an
    :class:`OmniLLMServerClient`.

    In two parts (the trainer's order): ``create_empty(config, worker_group=None)`` starts the balancer with no
    replica, so that the agent-loop workers can start on its client, then :meth:`launch_replicas` starts the
    replicas and adds them to the balancer. Each worker process imports torch and verl (tens of seconds on
    a busy 2-core machine): this way the agent-loop workers' start overlaps the engines' instead of
    following it (docs/development.md, "Keeping the suite fast").
    """

    def __init__(self, config, worker_group=None, rollout_resource_pool=None, start_rank: int = 0):
        super().__init__(
            config,
            worker_group=worker_group,
            rollout_resource_pool=rollout_resource_pool,
            start_rank=start_rank,
            load_balancer_cls=OmniRequestLoadBalancer,
        )
        self.routing = routing_config(self.rollout_config)

    async def _init_global_load_balancer(self) -> None:
        """One balancer actor with the configured policy (verl's factory would pass only the servers)."""
        self.global_load_balancer = self.new_load_balancer(self.routing.policy)
        if self.server_handles:
            logger.info("%d rollout replicas behind policy %s", len(self.server_handles), self.routing.policy)

    async def _initialize_llm_servers(self, start_rank: int | None = None):
        """verl's ``LLMServerManager._initialize_llm_servers`` makes ``devices / (tp x dp x pp)`` replicas; a
        replica with sequence parallelism spans ``ulysses_sequence_parallel_size`` times as many devices
        (:func:`replica_world_size`), so there are that many times fewer. Without it, verl's own path runs; with it,
        the replicas start here as verl starts them (hybrid on the worker group, else standalone), without verl's
        branches for engines other than ``vllm_omni`` and without its Prometheus / RL-Insight registration."""
        if sequence_parallel_size(self.rollout_config) == 1:
            return await super()._initialize_llm_servers(start_rank)
        per_replica = replica_world_size(self.rollout_config)
        start_rank = self.start_rank if start_rank is None else start_rank
        rollout = self.rollout_config
        devices = self.worker_group.world_size if self.worker_group else rollout.n_gpus_per_node * rollout.nnodes
        self.rollout_replicas = [
            self.rollout_replica_class(
                replica_rank=start_rank + rank,
                config=rollout,
                model_config=self.model_config,
                gpus_per_node=rollout.n_gpus_per_node,
            )
            for rank in range(devices // per_replica)
        ]
        if self.worker_group:
            await asyncio.gather(*[replica.init_hybrid(self.worker_group) for replica in self.rollout_replicas])
        else:
            await asyncio.gather(*[replica.init_standalone() for replica in self.rollout_replicas])
        self.server_handles = [replica._server_handle for replica in self.rollout_replicas]
        self.server_addresses = [replica._server_address for replica in self.rollout_replicas]

    @auto_await
    async def launch_replicas(self) -> None:
        """Start the replicas of a manager made by ``create_empty`` and add them to its balancer."""
        if self.server_handles:
            raise RuntimeError("launch_replicas() is for a manager made by create_empty(); this one has replicas")
        await self._initialize_llm_servers()
        await self.global_load_balancer.add_servers.remote(self._servers())
        logger.info("%d rollout replicas behind policy %s", len(self.server_handles), self.routing.policy)

    def _servers(self) -> dict:
        """``{address: sealed server actor}`` of the replicas, as the balancer holds them; addresses must tell them
        apart."""
        servers = dict(zip(self.server_addresses, map(SealedServer.seal, self.server_handles), strict=True))
        if len(servers) != len(self.server_handles):
            raise RuntimeError(f"rollout replicas report duplicate server addresses: {self.server_addresses}")
        return servers

    def new_load_balancer(self, policy: str):
        """A new balancer actor over this manager's replicas with ``policy`` (the shared one is
        ``global_load_balancer``; a second one lets a benchmark route the same replicas another way)."""
        return ray.remote(OmniRequestLoadBalancer).remote(
            servers=self._servers(), max_cache_size=self.routing.max_cache_size, policy=policy
        )

    def get_client(self, client_cls: type[LLMServerClient] | None = None, **kwargs) -> OmniLLMServerClient:
        """The client agent loops call (``generate`` / ``generate_batched``)."""
        client_cls = client_cls or OmniLLMServerClient
        if not issubclass(client_cls, OmniLLMServerClient):
            raise TypeError(f"client_cls must be an OmniLLMServerClient subclass, got {client_cls!r}")
        return super().get_client(client_cls=client_cls, **kwargs)

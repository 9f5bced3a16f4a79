"""Which rollout replica serves a request: ``OmniRequestLoadBalancer`` and its routing policies.

verl's ``GlobalRequestLoadBalancer`` routes each request id to the least-loaded replica, which
scatters the ``rollout.n`` copies of one prompt over all replicas. Diffusion rollouts want the
opposite: every copy of a prompt group on one replica, so that the replica can run them as one
transformer batch (``generate_batched``). The balancer therefore routes on a *routing key* (the
row's ``uid`` by default) through a named policy:

* ``prompt_uid_affinity`` (diffusion default): stable hash of the key onto the sorted replica ids,
  then sticky; a key whose replica is removed is re-routed, other keys stay where they are.
* ``prompt_hash_sharding``: the same stable hash, no memory (a pool change may move any key).
* ``least_inflight``: the replica with the fewest requests in flight (ties rotate).
* ``round_robin``: the sorted replicas in turn.

A new policy is a :class:`RoutingPolicy` subclass registered with ``@register_routing_policy``.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

from cachetools import LRUCache
from verl.base_config import BaseConfig
from verl.workers.rollout.router import DEFAULT_ROUTING_CACHE_SIZE, GlobalRequestLoadBalancer

from verl_omni.utils.registry import Registry

logger = logging.getLogger(__name__)


class RoutingPolicy:
    """Picks a replica for a routing key. ``sticky`` policies remember the choice per key."""

    sticky: bool = False

    def pick(self, key: str, balancer: OmniRequestLoadBalancer) -> str:
        raise NotImplementedError


ROUTING_POLICIES: Registry = Registry(
    "routing policy", check=lambda c: isinstance(c, type) and issubclass(c, RoutingPolicy)
)
register_routing_policy = ROUTING_POLICIES.register


def stable_hash(key: str) -> int:
    """A hash that is the same in every process and run (Python's ``hash`` of a str is not)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


@register_routing_policy("prompt_uid_affinity")
class PromptUidAffinity(RoutingPolicy):
    sticky = True

    def pick(self, key, balancer):
        ids = balancer.sorted_server_ids
        return ids[stable_hash(key) % len(ids)]


@register_routing_policy("prompt_hash_sharding")
class PromptHashSharding(PromptUidAffinity):
    sticky = False


@register_routing_policy("least_inflight")
class LeastInflight(RoutingPolicy):
    def __init__(self):
        self._tie_break = 0

    def pick(self, key, balancer):
        ids = balancer.sorted_server_ids
        loads = [balancer.get_inflight_count(sid) for sid in ids]
        least = min(loads)
        candidates = [sid for sid, load in zip(ids, loads, strict=True) if load == least]
        self._tie_break += 1
        return candidates[self._tie_break % len(candidates)]


@register_routing_policy("round_robin")
class RoundRobin(RoutingPolicy):
    def __init__(self):
        self._next = 0

    def pick(self, key, balancer):
        ids = balancer.sorted_server_ids
        sid = ids[self._next % len(ids)]
        self._next += 1
        return sid


@dataclass
class RolloutServerRoutingConfig(BaseConfig):
    """How requests are spread over rollout replicas (``actor_rollout_ref.rollout.server_routing``).

    Args:
        policy (str): a registered routing policy; ``prompt_uid_affinity`` keeps each prompt group
            on one replica so it can be generated as one batch.
        routing_key_field (str): the batch field whose value is the routing key (``uid``: one per prompt group).
        max_cache_size (int): sticky entries kept (LRU) by sticky policies.
    """

    policy: str = "prompt_uid_affinity"
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


class OmniRequestLoadBalancer(GlobalRequestLoadBalancer):
    """verl's load balancer with routing keys and pluggable policies (same public methods).

    Runs as a Ray actor shared by all agent-loop workers, like its parent; ``acquire_server``
    takes an optional ``routing_key`` (declared in :meth:`require_acquire_fields`, so verl's
    client forwards it) and falls back to the request id when none is given.
    """

    def __init__(
        self,
        servers: dict,
        max_cache_size: int = DEFAULT_ROUTING_CACHE_SIZE,
        policy: str = "prompt_uid_affinity",
    ):
        super().__init__(servers=servers, max_cache_size=max_cache_size)
        self.policy_name = policy
        self._policy: RoutingPolicy = ROUTING_POLICIES.get(policy)()
        self._sticky: LRUCache = LRUCache(maxsize=max_cache_size)
        self.sorted_server_ids: list[str] = sorted(self._servers)

    def acquire_server(self, request_id: str, routing_key: str | None = None) -> tuple[str, object]:
        """Reserve a replica for one request; returns ``(server_id, actor_handle)``."""
        if not self.sorted_server_ids:
            raise RuntimeError("No available servers in load balancer")
        key = str(routing_key) if routing_key is not None else str(request_id)
        server_id = self._sticky.get(key) if self._policy.sticky else None
        if server_id not in self._servers:
            server_id = self._policy.pick(key, self)
            if self._policy.sticky:
                self._sticky[key] = server_id
        self._inflight_requests[server_id] += 1
        return server_id, self._servers[server_id]

    def require_acquire_fields(self) -> list[str]:
        return ["routing_key"]

    def add_servers(self, servers: dict) -> None:
        super().add_servers(servers)
        self.sorted_server_ids = sorted(self._servers)

    def remove_servers(self, server_ids: list[str]) -> None:
        super().remove_servers(server_ids)
        self.sorted_server_ids = sorted(self._servers)

    def clear_sticky_cache(self) -> dict:
        cleared = len(self._sticky)
        self._sticky.clear()
        result = super().clear_sticky_cache()
        result["cleared_entries"] += cleared
        return result

    def get_status(self) -> dict:
        return {**super().get_status(), "policy": self.policy_name, "sticky_keys": len(self._sticky)}

"""Which rollout replica serves a request: ``OmniRequestLoadBalancer`` and its routing policies.

verl's ``GlobalRequestLoadBalancer`` routes each request id to the least-loaded replica, which
scatters the ``rollout.n`` copies of one prompt over all replicas. Diffusion rollouts want the
opposite: every copy of a prompt group on one replica, so that the replica can run them as one
transformer batch (``generate_batched``), and the step's groups spread evenly, because the step
waits on the slowest replica. The balancer therefore routes on a *routing key* (the row's ``uid``
by default) through a named policy:

* ``least_images_affinity`` (default): a key with no request in flight goes to the replica with the
  fewest images in flight (a ``generate_batched`` of 16 images counts 16); the key's later requests
  follow it there while any of its requests is in flight.
* ``prompt_uid_affinity``: stable hash of the key onto the sorted replica ids, then sticky (LRU);
  a key whose replica is removed is re-routed, other keys stay where they are.
* ``prompt_hash_sharding``: the same stable hash, no memory (a pool change may move any key).
* ``least_inflight``: the replica with the fewest requests in flight (ties rotate).
* ``round_robin``: the sorted replicas in turn.

The balancer books every request's replica, key and images at acquire and releases them by request
id, so in-flight images per replica and the replica of a key's in-flight requests are known to every
policy. A new policy is a :class:`RoutingPolicy` subclass registered with ``@register_routing_policy``.

The balancer implements verl's ``RequestLoadBalancer`` protocol (``verl.workers.rollout.router``)
structurally instead of subclassing ``GlobalRequestLoadBalancer``: importing anything of verl imports all
of it (torch, tensordict, ``verl.protocol``), and the balancer's Ray process needs none of that. This
module imports no torch and no verl, so that process starts in a fraction of a second and stays small
(``tests/workers/rollout/test_routing.py`` checks it). For the same reason the balancer holds each replica's actor
handle sealed (:class:`SealedServer`): unpickling a Ray actor handle imports its actor's class, and the replica's
class imports vLLM-Omni, torch and verl.
"""

from __future__ import annotations

import hashlib
import logging
import pickle
from collections import Counter
from dataclasses import dataclass

from cachetools import LRUCache

from verl_omni.utils.registry import Registry

logger = logging.getLogger(__name__)

# the policy a run gets without ``server_routing.policy``: the config's default and the balancer's
DEFAULT_ROUTING_POLICY = "least_images_affinity"
# sticky (LRU) placements a sticky policy keeps without ``server_routing.max_cache_size``
DEFAULT_ROUTING_CACHE_SIZE = 10000


class SealedServer:
    """A replica's Ray actor handle, pickled, so that the balancer can hold it and hand it out unopened.

    Ray loads an actor's class wherever one of its handles is unpickled (``make_actor_handle``), and the replica's
    class imports vLLM-Omni, torch and verl: about 1 GB and 15 s of imports in a process that only counts requests.
    The agent-loop client, which calls the replica, opens it (:meth:`open`).
    """

    __slots__ = ("payload",)

    def __init__(self, payload: bytes):
        self.payload = payload

    @classmethod
    def seal(cls, handle) -> SealedServer:
        return cls(pickle.dumps(handle))

    def open(self):
        """The actor handle (in a process connected to the replica's Ray cluster)."""
        return pickle.loads(self.payload)

    def __eq__(self, other) -> bool:
        return isinstance(other, SealedServer) and other.payload == self.payload

    def __hash__(self) -> int:
        return hash(self.payload)


class RoutingPolicy:
    """Picks a replica for a routing key. ``sticky`` policies remember the choice per key (LRU)."""

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


class _LeastLoaded(RoutingPolicy):
    """The replica with the smallest :meth:`load`; ties rotate so that an idle pool fills evenly."""

    def __init__(self):
        self._tie_break = 0

    def load(self, server_id: str, balancer: OmniRequestLoadBalancer) -> int:
        raise NotImplementedError

    def pick(self, key, balancer):
        ids = balancer.sorted_server_ids
        loads = [self.load(sid, balancer) for sid in ids]
        least = min(loads)
        candidates = [sid for sid, load in zip(ids, loads, strict=True) if load == least]
        self._tie_break += 1
        return candidates[self._tie_break % len(candidates)]


@register_routing_policy("least_inflight")
class LeastInflight(_LeastLoaded):
    def load(self, server_id, balancer):
        return balancer.get_inflight_count(server_id)


@register_routing_policy("least_images_affinity")
class LeastImagesAffinity(_LeastLoaded):
    """A group's first request goes where the fewest images are in flight; the group follows it.

    The affinity lasts while the key has a request in flight, and needs no cache: a group's
    concurrent requests share one replica (which can batch them), and once they have all finished
    the key is free, so a later request of it is placed by load again.
    """

    def load(self, server_id, balancer):
        return balancer.get_inflight_images(server_id)

    def pick(self, key, balancer):
        home = balancer.inflight_home(key)
        return home if home is not None else super().pick(key, balancer)


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
class _Booking:
    """One in-flight request as the balancer booked it; ``counted`` is False once its replica was removed."""

    server_id: str
    key: str
    images: int
    counted: bool = True


class OmniRequestLoadBalancer:
    """A load balancer with routing keys, image-counted load and pluggable policies (verl's public methods).

    Runs as a Ray actor shared by all agent-loop workers, as verl's ``GlobalRequestLoadBalancer`` does. ``acquire_server`` takes
    an optional ``routing_key`` (falling back to the request id) and ``num_images`` (the request's
    images, default 1), both declared in :meth:`require_acquire_fields` so verl's client forwards
    them; ``release_server`` needs the ``request_id`` (declared in :meth:`require_release_fields`)
    to release that request's images and key.
    """

    def __init__(
        self,
        servers: dict,
        max_cache_size: int = DEFAULT_ROUTING_CACHE_SIZE,
        policy: str = DEFAULT_ROUTING_POLICY,
    ):
        self._servers: dict = dict(servers)
        self._inflight_requests: dict[str, int] = dict.fromkeys(self._servers, 0)
        self.policy_name = policy
        self._policy: RoutingPolicy = ROUTING_POLICIES.get(policy)()
        self._sticky: LRUCache = LRUCache(maxsize=max_cache_size)
        self.sorted_server_ids: list[str] = sorted(self._servers)
        self._images: dict[str, int] = dict.fromkeys(self._servers, 0)
        # request id -> its bookings (a caller may reuse an id for concurrent requests)
        self._bookings: dict[str, list[_Booking]] = {}
        # routing key -> in-flight requests per replica (only replicas in the pool)
        self._key_servers: dict[str, Counter] = {}

    def acquire_server(
        self, request_id: str, routing_key: str | None = None, num_images: int = 1
    ) -> tuple[str, object]:
        """Reserve a replica for one request of ``num_images`` images; returns ``(server_id, server)``, the replica
        as :meth:`add_servers` was given it (the manager gives each one sealed: :class:`SealedServer`)."""
        if isinstance(num_images, bool) or not isinstance(num_images, int) or num_images < 1:
            raise ValueError(
                f"num_images (the request's images, generate_batched's num_outputs_per_prompt) must be "
                f"a positive int, got {num_images!r} for request {request_id!r}"
            )
        if not self.sorted_server_ids:
            raise RuntimeError("No available servers in load balancer")
        key = str(routing_key) if routing_key is not None else str(request_id)
        server_id = self._sticky.get(key) if self._policy.sticky else None
        if server_id not in self._servers:
            server_id = self._policy.pick(key, self)
            if self._policy.sticky:
                self._sticky[key] = server_id
        self._book(str(request_id), _Booking(server_id, key, num_images))
        return server_id, self._servers[server_id]

    def release_server(self, server_id: str, request_id: str | None = None) -> None:
        """Release the request ``request_id`` acquired on ``server_id``: its images, and its key's hold on the replica."""
        bookings = self._bookings.get(str(request_id), [])
        booking = next((b for b in bookings if b.server_id == server_id), None)
        if booking is None:
            raise ValueError(
                f"release_server({server_id!r}, request_id={request_id!r}): no such request in flight "
                "(released twice, or released without the request_id given to acquire_server)"
            )
        bookings.remove(booking)
        if not bookings:
            del self._bookings[str(request_id)]
        if booking.counted:
            self._inflight_requests[server_id] -= 1
            self._images[server_id] -= booking.images
            self._unhold(booking.key, server_id)

    def require_acquire_fields(self) -> list[str]:
        return ["routing_key", "num_images"]

    def require_release_fields(self) -> list[str]:
        return ["request_id"]

    def get_inflight_images(self, server_id: str) -> int:
        """Images of the requests in flight on ``server_id`` (a batched request counts all its images)."""
        return self._images.get(server_id, 0)

    def inflight_home(self, key: str) -> str | None:
        """The replica serving ``key``'s in-flight requests (the busiest for it if several), or None."""
        held = self._key_servers.get(key)
        return held.most_common(1)[0][0] if held else None

    def get_inflight_count(self, server_id: str) -> int:
        """Requests in flight on ``server_id``."""
        return self._inflight_requests.get(server_id, 0)

    def get_total_inflight(self) -> int:
        """Requests in flight on every replica in the pool (verl's async drain polls it)."""
        return sum(self._inflight_requests.values())

    def get_all_servers(self) -> list[str]:
        """The replicas in the pool."""
        return list(self._servers)

    def add_servers(self, servers: dict) -> None:
        """Add replicas (``{server_id: server}``, each a :class:`SealedServer` in a run) with nothing in flight."""
        self._servers.update(servers)
        self._inflight_requests.update(dict.fromkeys(servers, 0))
        self._images.update(dict.fromkeys(servers, 0))
        self.sorted_server_ids = sorted(self._servers)
        logger.info("balancer: added %d replicas", len(servers))

    def remove_servers(self, server_ids: list[str]) -> None:
        """Drop replicas; their in-flight requests stop counting (their releases are still accepted)."""
        gone = set(server_ids)
        for sid in gone:
            self._servers.pop(sid, None)
            self._inflight_requests.pop(sid, None)
        for bookings in self._bookings.values():
            for booking in bookings:
                if booking.counted and booking.server_id in gone:
                    booking.counted = False
                    self._unhold(booking.key, booking.server_id)
        for sid in gone:
            self._images.pop(sid, None)
        self.sorted_server_ids = sorted(self._servers)

    def clear_sticky_cache(self) -> dict:
        """Forget the sticky (LRU) placements; in-flight requests keep their replica and their key's hold."""
        cleared = len(self._sticky)
        self._sticky.clear()
        return {"cleared_entries": cleared, "server_loads": dict(self._inflight_requests)}

    def get_status(self) -> dict:
        """The pool's state, for debugging: verl's keys and the routing's own."""
        return {
            "servers": dict(self._inflight_requests),
            "total_inflight": self.get_total_inflight(),
            "active_servers": len(self._inflight_requests),
            "registered_handles": list(self._servers),
            "policy": self.policy_name,
            "sticky_keys": len(self._sticky),
            "inflight_images": dict(self._images),
            "inflight_keys": len(self._key_servers),
        }

    def _book(self, request_id: str, booking: _Booking) -> None:
        self._bookings.setdefault(request_id, []).append(booking)
        self._inflight_requests[booking.server_id] += 1
        self._images[booking.server_id] += booking.images
        self._key_servers.setdefault(booking.key, Counter())[booking.server_id] += 1

    def _unhold(self, key: str, server_id: str) -> None:
        held = self._key_servers[key]
        held[server_id] -= 1
        if held[server_id] <= 0:
            del held[server_id]
        if not held:
            del self._key_servers[key]

"""Routing policies of OmniRequestLoadBalancer, driven directly (the balancer is a plain class; Ray wraps it)."""

import itertools
import random
from collections import Counter, defaultdict

import pytest

from verl_omni.workers.rollout.routing import (
    ROUTING_POLICIES,
    OmniRequestLoadBalancer,
    RolloutServerRoutingConfig,
    stable_hash,
)

SERVERS = {f"10.0.0.{i}:800{i}": f"handle-{i}" for i in range(4)}
KEYS = [f"uid-{k}" for k in range(64)]
N = 16


def route_all(lb, keys=KEYS, release=True):
    """Send N requests per key (interleaved like concurrent groups); return key -> set of servers."""
    where = defaultdict(set)
    for r, key in itertools.product(range(N), keys):
        sid, handle = lb.acquire_server(request_id=f"{key}-{r}", routing_key=key)
        assert handle == SERVERS[sid]
        where[key].add(sid)
        if release:
            lb.release_server(sid)
    return where


def test_affinity_keeps_each_key_on_one_server_and_spreads_keys():
    lb = OmniRequestLoadBalancer(SERVERS, policy="prompt_uid_affinity")
    where = route_all(lb)
    assert all(len(s) == 1 for s in where.values())
    per_server = Counter(next(iter(s)) for s in where.values())
    mean = len(KEYS) / len(SERVERS)
    assert set(per_server) == set(SERVERS)
    assert all(0.5 * mean <= c <= 1.5 * mean for c in per_server.values()), per_server


def test_affinity_is_the_same_in_another_balancer_instance():
    a = route_all(OmniRequestLoadBalancer(SERVERS, policy="prompt_uid_affinity"))
    b = route_all(OmniRequestLoadBalancer(dict(reversed(SERVERS.items())), policy="prompt_uid_affinity"))
    assert a == b


def test_removing_a_server_moves_only_its_keys():
    lb = OmniRequestLoadBalancer(SERVERS, policy="prompt_uid_affinity")
    before = {k: next(iter(s)) for k, s in route_all(lb).items()}
    gone = sorted(SERVERS)[1]
    lb.remove_servers([gone])
    after = {k: next(iter(s)) for k, s in route_all(lb).items()}
    moved = {k for k in KEYS if before[k] != after[k]}
    assert moved == {k for k in KEYS if before[k] == gone}
    assert gone not in after.values()
    assert lb.sorted_server_ids == sorted(set(SERVERS) - {gone})


def test_hash_sharding_is_stateless_and_stable():
    lb = OmniRequestLoadBalancer(SERVERS, policy="prompt_hash_sharding")
    where = route_all(lb)
    ids = sorted(SERVERS)
    assert all(s == {ids[stable_hash(k) % 4]} for k, s in where.items())
    assert lb.get_status()["sticky_keys"] == 0


def test_least_inflight_never_lets_a_server_lead_by_more_than_one():
    lb = OmniRequestLoadBalancer(SERVERS, policy="least_inflight")
    rng = random.Random(0)
    held = []
    for i in range(len(KEYS) * N):
        # interleave: mostly acquire, sometimes release a random in-flight request
        if held and rng.random() < 0.4:
            lb.release_server(held.pop(rng.randrange(len(held))))
        sid, _ = lb.acquire_server(request_id=f"r{i}", routing_key=KEYS[i % len(KEYS)])
        held.append(sid)
        loads = lb.get_status()["servers"]
        assert max(loads.values()) - min(loads.values()) <= 1, loads


def test_round_robin_cycles_through_sorted_servers():
    lb = OmniRequestLoadBalancer(SERVERS, policy="round_robin")
    got = [lb.acquire_server(request_id=f"r{i}", routing_key="same")[0] for i in range(8)]
    assert got == sorted(SERVERS) * 2


def test_without_routing_key_the_request_id_is_the_key():
    lb = OmniRequestLoadBalancer(SERVERS, policy="prompt_uid_affinity")
    a = lb.acquire_server(request_id="req-7")[0]
    assert all(lb.acquire_server(request_id="req-7")[0] == a for _ in range(5))
    assert lb.require_acquire_fields() == ["routing_key"]


def test_added_server_joins_and_clear_sticky_cache_reports_entries():
    lb = OmniRequestLoadBalancer(dict(list(SERVERS.items())[:2]), policy="prompt_uid_affinity")
    route_all(lb, KEYS[:8])
    lb.add_servers(dict(list(SERVERS.items())[2:]))
    assert lb.sorted_server_ids == sorted(SERVERS)
    assert lb.clear_sticky_cache()["cleared_entries"] == 8
    where = route_all(lb)
    assert {next(iter(s)) for s in where.values()} == set(SERVERS)


def test_empty_pool_raises():
    lb = OmniRequestLoadBalancer({}, policy="round_robin")
    with pytest.raises(RuntimeError, match="No available servers"):
        lb.acquire_server(request_id="x")


def test_unknown_policy_is_named_in_the_error():
    with pytest.raises(ValueError, match="'sticky_magic'.*prompt_uid_affinity"):
        OmniRequestLoadBalancer(SERVERS, policy="sticky_magic")
    with pytest.raises(ValueError, match="server_routing.policy='sticky_magic'"):
        RolloutServerRoutingConfig(policy="sticky_magic")


def test_config_defaults_and_validation():
    cfg = RolloutServerRoutingConfig()
    assert (cfg.policy, cfg.routing_key_field) == ("prompt_uid_affinity", "uid")
    with pytest.raises(ValueError, match="max_cache_size"):
        RolloutServerRoutingConfig(max_cache_size=0)
    with pytest.raises(ValueError, match="routing_key_field"):
        RolloutServerRoutingConfig(routing_key_field="")
    assert set(ROUTING_POLICIES.names()) == {
        "prompt_uid_affinity",
        "prompt_hash_sharding",
        "least_inflight",
        "round_robin",
    }

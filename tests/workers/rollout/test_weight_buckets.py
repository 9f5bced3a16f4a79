"""The full-weight sync's buckets and their receiver, on plain tensors (the engine test drives the real rollout).

The receiver's ``load`` here writes into a dict, the way the rollout's ``load_weights`` writes into its
module; the bucket checks are what is under test.
"""

import pytest
import torch

from verl_omni.workers.rollout.weight_buckets import (
    WeightBucket,
    WeightSyncError,
    WeightSyncReceiver,
    buckets_of,
    plan_buckets,
)


def weights() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {f"blocks.{i}.weight": torch.randn(16, 16, generator=generator) for i in range(6)} | {
        "big.weight": torch.randn(64, 64, generator=generator)
    }


def receiver_into(store: dict) -> WeightSyncReceiver:
    def load(named):
        store.update({name: tensor.clone() for name, tensor in named})
        return {name for name, _ in named}

    return WeightSyncReceiver(load, expected=lambda: set(weights()))


def test_plan_bounds_buckets_and_gives_a_larger_tensor_its_own():
    sizes = [("a", 400), ("b", 400), ("c", 400), ("huge", 5000), ("d", 100)]
    assert plan_buckets(sizes, 1000) == [["a", "b"], ["c"], ["huge"], ["d"]]
    with pytest.raises(ValueError, match="bucket_bytes"):
        plan_buckets(sizes, 0)


def test_complete_sync_loads_every_tensor_and_reports_it():
    store: dict = {}
    receiver = receiver_into(store)
    buckets = list(buckets_of(3, weights(), bucket_bytes=2048))
    assert len(buckets) > 2
    receiver.begin(3, len(buckets))
    for bucket in reversed(buckets):
        receiver.receive(bucket)
    report = receiver.finish(3)
    assert report["buckets"] == len(buckets) and report["params"] == len(weights())
    assert report["bytes"] == sum(t.numel() * 4 for t in weights().values())
    assert all(torch.equal(store[name], tensor) for name, tensor in weights().items())


def test_dropped_bucket_fails_the_sync_naming_it():
    receiver = receiver_into({})
    buckets = list(buckets_of(1, weights(), bucket_bytes=2048))
    receiver.begin(1, len(buckets))
    for bucket in buckets[:1] + buckets[2:]:
        receiver.receive(bucket)
    with pytest.raises(WeightSyncError, match=r"lost buckets \[1\]"):
        receiver.finish(1)


def test_corrupted_bucket_is_refused_before_it_loads_and_fails_the_sync():
    store: dict = {}
    receiver = receiver_into(store)
    (bucket, *rest) = list(buckets_of(2, weights(), bucket_bytes=2048))
    name = next(iter(bucket.tensors))
    bucket.tensors[name] = bucket.tensors[name].clone()
    bucket.tensors[name][0, 0] += 1e-6
    receiver.begin(2, 1 + len(rest))
    with pytest.raises(WeightSyncError, match="bucket 0 of weight sync 2 is corrupted"):
        receiver.receive(bucket)
    assert name not in store
    for other in rest:
        receiver.receive(other)
    with pytest.raises(WeightSyncError, match="failed earlier"):
        receiver.finish(2)


def test_bucket_of_another_sync_or_twice_or_naming_nothing_is_refused():
    receiver = WeightSyncReceiver(lambda named: set(), expected=set)
    receiver.begin(5, 2)
    stale = WeightBucket.build(4, 0, 2, {"x": torch.ones(2)})
    with pytest.raises(WeightSyncError, match="sync 4 arrived while sync 5"):
        receiver.receive(stale)
    with pytest.raises(WeightSyncError, match="set no rollout parameter"):
        receiver.receive(WeightBucket.build(5, 0, 2, {"x": torch.ones(2)}))

    store: dict = {}
    receiver = receiver_into(store)
    receiver.begin(6, 2)
    first = WeightBucket.build(6, 0, 2, {"blocks.0.weight": torch.ones(2)})
    receiver.receive(first)
    with pytest.raises(WeightSyncError, match="arrived twice"):
        receiver.receive(first)


def test_sync_that_leaves_a_rollout_parameter_unwritten_fails_naming_it():
    receiver = receiver_into({})
    partial = {name: t for name, t in weights().items() if name != "big.weight"}
    buckets = list(buckets_of(7, partial, bucket_bytes=1 << 20))
    receiver.begin(7, len(buckets))
    for bucket in buckets:
        receiver.receive(bucket)
    with pytest.raises(WeightSyncError, match=r"not written: \['big.weight'\]"):
        receiver.finish(7)

"""Reward workers' devices on a real local Ray cluster with two logical GPUs.

Ray hands out logical GPUs (``ray.init(num_gpus=2)``) exactly as physical ones: it assigns ids and
sets ``CUDA_VISIBLE_DEVICES`` for each actor, which is what the layouts decide. The actor's pool is
verl's ``RayResourcePool`` over a placement group made here with a GPU bundle (on this CPU machine
verl's platform would make CPU-only bundles); a probe actor stands in for the actor worker.
"""

import os
from pathlib import Path

import pytest
from reward_loop_helpers import make_config

pytestmark = pytest.mark.slow

REPO_ROOT = str(Path(__file__).resolve().parents[2])
BRIGHTNESS = [{"type": "brightness"}]
COLOCATE = 4


@pytest.fixture(scope="module")
def gpu_cluster():
    import ray

    from verl_omni.utils.ray_start import init_local_ray

    # Ray's local start sets RAY_* variables here, and this process keeps the auth mode it first used: later
    # modules join the session's no-auth cluster (tests/conftest.py), so this one starts without auth too
    environ = dict(os.environ)
    os.environ["RAY_AUTH_MODE"] = "disabled"
    pythonpath = os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p)
    init_local_ray(
        num_cpus=8, num_gpus=2, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": pythonpath}}
    )
    yield ray
    ray.shutdown()
    os.environ.clear()
    os.environ.update(environ)


@pytest.fixture(scope="module")
def actor_pool(gpu_cluster):
    """verl's pool over one bundle {CPU: 4, GPU: 1}, and the GPU id its probe actor got."""
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    from verl.single_controller.ray.base import RayResourcePool

    ray = gpu_cluster
    pg = placement_group([{"CPU": COLOCATE, "GPU": 1}], strategy="STRICT_PACK")
    ray.get(pg.ready())
    pool = RayResourcePool([1], use_gpu=True, max_colocate_count=COLOCATE)
    pool.pgs = [pg]

    @ray.remote
    class Probe:
        def gpu_ids(self):
            return [str(i) for i in ray.get_gpu_ids()]

    strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=0)
    probe = Probe.options(scheduling_strategy=strategy, num_gpus=1 / COLOCATE, num_cpus=1).remote()
    return pool, ray.get(probe.gpu_ids.remote())


def device_infos(ray, manager):
    try:
        return ray.get([w.device_info.remote() for w in manager.reward_loop_workers])
    finally:
        for worker in manager.reward_loop_workers:
            ray.kill(worker)


def test_own_pool_gives_workers_a_gpu_beside_the_actors(gpu_cluster, actor_pool):
    from verl_omni.reward_loop import DiffusionRewardLoopManager

    pool, actor_gpus = actor_pool
    config = make_config(scorers=BRIGHTNESS, num_gpus_per_worker=1, resource_pool="own")
    (info,) = device_infos(gpu_cluster, DiffusionRewardLoopManager(config, rm_resource_pool=pool))
    assert len(actor_gpus) == 1 and len(info["gpu_ids"]) == 1
    assert info["gpu_ids"] != actor_gpus
    assert info["cuda_visible_devices"] == info["gpu_ids"][0]


def test_actor_pool_puts_workers_on_the_actors_gpu(gpu_cluster, actor_pool):
    from verl_omni.reward_loop import DiffusionRewardLoopManager

    pool, actor_gpus = actor_pool
    config = make_config(scorers=BRIGHTNESS, num_workers=2, num_gpus_per_worker=1 / COLOCATE, resource_pool="actor")
    infos = device_infos(gpu_cluster, DiffusionRewardLoopManager(config, rm_resource_pool=pool))
    assert [info["gpu_ids"] for info in infos] == [actor_gpus, actor_gpus]
    assert all(info["cuda_visible_devices"] == actor_gpus[0] for info in infos)


@pytest.mark.parametrize(
    "diffusion, message",
    [
        (
            {"num_workers": 2, "num_gpus_per_worker": 1, "resource_pool": "own"},
            r"2 workers x num_gpus_per_worker=1 need 2 GPUs of their own, the Ray cluster has [01] free",
        ),
        (
            {"num_gpus_per_worker": 0.5, "resource_pool": "actor"},
            r"resource_pool=actor: num_gpus_per_worker=0.5 exceeds .* \(1 / max_colocate_count = 0.25\)",
        ),
        (
            {"num_cpus_per_worker": 4, "resource_pool": "actor"},
            r"num_cpus_per_worker=4 does not fit beside the actor in a bundle of 4 CPU",
        ),
    ],
)
def test_layouts_that_cannot_fit_fail_before_any_worker_waits(gpu_cluster, actor_pool, diffusion, message):
    from verl_omni.reward_loop import DiffusionRewardLoopManager

    with pytest.raises(ValueError, match=message):
        DiffusionRewardLoopManager(make_config(scorers=BRIGHTNESS, **diffusion), rm_resource_pool=actor_pool[0])


def test_actor_layout_needs_the_actors_pool(gpu_cluster):
    from verl_omni.reward_loop import DiffusionRewardLoopManager

    config = make_config(scorers=BRIGHTNESS, resource_pool="actor", num_cpus_per_worker=0)
    with pytest.raises(ValueError, match=r"resource_pool=actor needs the actor's resource pool"):
        DiffusionRewardLoopManager(config)

"""Where the reward workers run: Ray options for each worker from ``reward.diffusion``.

Two layouts (docs/guide/rewards.md, "Devices"):

- ``resource_pool: own``: each worker reserves ``num_cpus_per_worker`` CPUs and
  ``num_gpus_per_worker`` GPUs of its own; Ray gives it GPUs outside the actor's placement groups
  (a fraction shares one GPU among workers) and sets its ``CUDA_VISIBLE_DEVICES``.
- ``resource_pool: actor``: the workers go round-robin onto the bundles of the actor's resource
  pool, each taking ``num_gpus_per_worker`` of its bundle's GPU, as verl places the worker groups it
  colocates (a bundle holds one GPU and ``max_colocate_count`` CPUs; each colocated group takes
  ``1 / max_colocate_count`` of both). The reward model then shares the actor's GPU.

Both check the cluster before creating anything, because a Ray actor whose resources do not fit
waits forever instead of failing.
"""

from __future__ import annotations

import logging

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from verl.single_controller.ray.base import RayResourcePool

from verl_omni.workers.config.reward import CONFIG_KEY, DiffusionRewardConfig

logger = logging.getLogger(__name__)


def worker_options(cfg: DiffusionRewardConfig, actor_pool: RayResourcePool | None) -> list[dict]:
    """Ray ``.options(...)`` for each of the ``cfg.num_workers`` reward workers."""
    if cfg.resource_pool == "actor":
        return _on_actor_pool(cfg, actor_pool)
    return _own(cfg)


def _own(cfg: DiffusionRewardConfig) -> list[dict]:
    needed = cfg.gpus_of_own
    if needed > 0:
        free = ray.available_resources().get("GPU", 0.0)
        if needed > free + 1e-9:
            raise ValueError(
                f"{CONFIG_KEY}: {cfg.num_workers} workers x num_gpus_per_worker={cfg.num_gpus_per_worker} need "
                f"{needed:g} GPUs of their own, the Ray cluster has {free:g} free beside the actor's: lower "
                f"{CONFIG_KEY}.num_workers / num_gpus_per_worker, or share the actor's GPUs with "
                f"{CONFIG_KEY}.resource_pool=actor"
            )
    return [{"num_cpus": cfg.num_cpus_per_worker, "num_gpus": cfg.num_gpus_per_worker}] * cfg.num_workers


def _on_actor_pool(cfg: DiffusionRewardConfig, pool: RayResourcePool | None) -> list[dict]:
    key = f"{CONFIG_KEY}.resource_pool=actor"
    if pool is None:
        raise ValueError(f"{key} needs the actor's resource pool, but the reward loop was given none")
    share = 1.0 / pool.max_colocate_count
    if cfg.num_gpus_per_worker > 0 and not pool.use_gpu:
        raise ValueError(f"{key}: the actor's resource pool has no GPUs; set {CONFIG_KEY}.num_gpus_per_worker=0")
    if cfg.num_gpus_per_worker > share + 1e-9:
        raise ValueError(
            f"{key}: num_gpus_per_worker={cfg.num_gpus_per_worker} exceeds what a colocated worker group may take "
            f"of a bundle's GPU (1 / max_colocate_count = {share:g})"
        )
    if cfg.num_cpus_per_worker > pool.max_colocate_count - 1:
        raise ValueError(
            f"{key}: num_cpus_per_worker={cfg.num_cpus_per_worker} does not fit beside the actor in a bundle of "
            f"{pool.max_colocate_count} CPU(s); set {CONFIG_KEY}.num_cpus_per_worker <= {pool.max_colocate_count - 1}"
        )
    bundles = [(pg, i) for pg in pool.get_placement_groups() for i in range(pg.bundle_count)]
    options = []
    for w in range(cfg.num_workers):
        pg, index = bundles[w % len(bundles)]
        options.append(
            {
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=index
                ),
                "num_cpus": cfg.num_cpus_per_worker,
                "num_gpus": cfg.num_gpus_per_worker,
            }
        )
    return options

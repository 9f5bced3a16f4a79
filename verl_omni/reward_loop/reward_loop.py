"""Diffusion reward loop: a pool of Ray workers scoring images, synchronously or per sample.

- Synchronous: the trainer calls :meth:`DiffusionRewardLoopManager.compute_rm_score` on the whole
  rollout batch; each worker scores its chunk with batched scorers.
- Asynchronous (``reward.diffusion.async_reward``): :attr:`reward_loop_worker_handles` hands the
  workers to the agent loop, which calls ``compute_score`` on each sample as soon as its image is
  generated, so scoring overlaps the rest of the rollout (verl's streaming-reward contract).
"""

from __future__ import annotations

import logging
import os

import numpy as np
import ray
from ray.actor import ActorHandle
from tensordict import TensorDict
from verl.experimental.reward_loop import RewardLoopManager, RewardLoopWorker
from verl.protocol import DataProto, pad_dataproto_to_divisor
from verl.single_controller.ray.base import RayResourcePool
from verl.trainer.ppo.reward import resolve_reward_manager_cls

from verl_omni.reward_loop.placement import worker_options
from verl_omni.reward_loop.reward_manager import DiffusionRewardManager
from verl_omni.utils.reward_score import reward_metrics
from verl_omni.workers.config.reward import DiffusionRewardConfig

logger = logging.getLogger(__name__)


def diffusion_manager_cls(config) -> type[DiffusionRewardManager]:
    """The reward manager class named by ``reward.reward_manager``; it must be a diffusion one."""
    manager_cls = resolve_reward_manager_cls(config)
    if not (isinstance(manager_cls, type) and issubclass(manager_cls, DiffusionRewardManager)):
        raise ValueError(
            f"reward.reward_manager.name={config.reward.reward_manager.name!r} resolves to {manager_cls!r}, "
            "which cannot score images; use 'diffusion' (or a DiffusionRewardManager subclass)"
        )
    return manager_cls


class DiffusionRewardLoopWorker(RewardLoopWorker):
    """Scores images with a :class:`DiffusionRewardManager`; runs as a Ray actor (see the manager).

    Unlike verl's worker it loads no tokenizer (prompts arrive as text) and no reward-model router:
    model-based scorers own their models or endpoints.
    """

    def _init_reward_fn(self):
        """Called by verl's ``RewardLoopWorker.__init__``: build the diffusion reward manager."""
        self.reward_manager = diffusion_manager_cls(self.config)(self.config)

    async def compute_score_batch(self, data: DataProto) -> list[dict]:
        """Score a chunk; batched scorers see the whole chunk at once."""
        return await self.reward_manager.run_batch(data)

    async def compute_score(self, data: DataProto) -> dict:
        """Score one finished sample: ``{"reward_score": float, "reward_extra_info": {...}}``."""
        return await self.reward_manager.run_single(data)

    def device_info(self) -> dict:
        """Where this worker runs: Ray's GPU ids for it and the ``CUDA_VISIBLE_DEVICES`` it sees."""
        return {
            "gpu_ids": [str(i) for i in ray.get_gpu_ids()],
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }


class DiffusionRewardLoopManager(RewardLoopManager):
    """Creates the reward workers and scores rollout batches of images.

    Workers get ``num_cpus_per_worker`` / ``num_gpus_per_worker`` each, from GPUs of their own or
    from the actor's bundles (``reward.diffusion.resource_pool``, :mod:`.placement`). verl's
    reward-model server is not used: scorers reach their models directly, so ``rm_resource_pool``
    is the actor's resource pool, used only with ``resource_pool: actor``.
    """

    def __init__(self, config, rm_resource_pool: RayResourcePool | None = None):
        self.config = config
        self.reward_config = DiffusionRewardConfig.from_config(config.reward.get("diffusion"))
        self.actor_pool = rm_resource_pool
        self.reward_model_manager = None
        self.reward_router_address = None
        self.reward_manager_cls = diffusion_manager_cls(config)
        self.reward_loop_workers_class = ray.remote(DiffusionRewardLoopWorker)
        self._init_reward_loop_workers()

    @property
    def reward_loop_worker_handles(self) -> list[ActorHandle] | None:
        """The workers when ``async_reward`` is on (the agent loop scores per sample), else None."""
        return self.reward_loop_workers if self.reward_config.async_reward else None

    def _init_reward_loop_workers(self):
        self.reward_loop_workers = [
            self.reward_loop_workers_class.options(**options).remote(self.config, None)
            for options in worker_options(self.reward_config, self.actor_pool)
        ]

    def compute_rm_score(self, data: DataProto) -> DataProto:
        """Score ``data`` across the workers.

        Returns a DataProto with ``batch["rm_scores"]`` float32 ``[B]``, one ``non_tensor_batch``
        array per scorer (``reward/<name>``, NaN where an optional scorer was left out), and
        ``meta_info["metrics"]`` (``reward/mean``, ``reward/<name>/mean``, ``reward/<name>/excluded``).
        """
        num_workers = len(self.reward_loop_workers)
        padded, pad_size = pad_dataproto_to_divisor(data, num_workers)
        chunks = padded.chunk(num_workers)
        outputs = ray.get(
            [w.compute_score_batch.remote(c) for w, c in zip(self.reward_loop_workers, chunks, strict=True)]
        )
        outputs = [item for chunk in outputs for item in chunk][: len(data)]
        scores = [item["reward_score"] for item in outputs]
        extra_infos = [item["reward_extra_info"] for item in outputs]
        keys = list(extra_infos[0])
        return DataProto(
            batch=TensorDict(
                {"rm_scores": self.reward_manager_cls.assemble_rm_scores(data, scores)}, batch_size=len(data)
            ),
            non_tensor_batch={key: np.array([info[key] for info in extra_infos]) for key in keys},
            meta_info={"reward_extra_keys": keys, "metrics": reward_metrics(scores, extra_infos)},
        )

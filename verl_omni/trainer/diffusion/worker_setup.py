"""How ``RayFlowGRPOTrainer`` comes up: the device layout check, the prompt dataloaders, and the actor, reward,
rollout and agent-loop workers started side by side (``_setup`` calls these in that order).

A mixin of the trainer (listed before verl's ``PPOTrainer``, whose own ``_init_tokenizer`` / ``_init_dataloader``
build token datasets): it reads the trainer's ``config`` / ``configs``, ``device`` and ``colocate`` and sets the
attributes the loop uses (``train_dataloader``, ``val_dataloader``, ``total_training_steps``, ``actor_rollout_wg``,
``reward_loop_manager``, ``llm_server_manager``, ``agent_loop_manager``, and ``worker_placement``: where each
Ray worker runs, logged once and named by :meth:`WorkerSetup.lost_worker_message` when one is lost).
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace

import ray
from torchdata.stateful_dataloader import StatefulDataLoader
from verl.trainer.ppo.utils import create_rl_sampler
from verl.utils.dataset.rl_dataset import collate_fn

from verl_omni.utils.background import run_beside
from verl_omni.utils.dataset.prompt_dataset import create_prompt_dataset
from verl_omni.utils.ray_start import actor_location

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))


# which of the placed workers (``worker_placement``'s names) each phase of a step waits on
PHASE_WORKERS = {
    "gen": ("replica", "agent-loop worker", "request balancer", "reward worker"),
    "testing": ("replica", "agent-loop worker", "request balancer", "reward worker"),
    "reward": ("reward worker",),
    "old_log_prob": ("actor rank",),
    "ref": ("actor rank",),
    "update_actor": ("actor rank",),
    "save_checkpoint": ("actor rank",),
    "sync": ("actor rank", "replica"),
}


class WorkerSetup:
    """The trainer's start-up steps (see the module docstring)."""

    def _check_device_layout(self):
        """Fail before any placement group waits forever: the layout must fit the cluster's GPUs (on CPU, its
        logical CPUs)."""
        if self.device == "cpu":
            self._check_cpu_layout()
        if self.device != "cuda":
            return
        trainer, rollout = self.configs.trainer, self.config.actor_rollout_ref.rollout
        actor_gpus = trainer.nnodes * trainer.n_gpus_per_node
        rollout_gpus = 0 if self.colocate else rollout.nnodes * rollout.n_gpus_per_node
        reward_gpus = self.configs.reward.gpus_of_own
        available = int(ray.cluster_resources().get("GPU", 0))
        if actor_gpus + rollout_gpus + reward_gpus > available:
            raise ValueError(
                f"the actor asks {actor_gpus} GPUs (trainer.nnodes x trainer.n_gpus_per_node), the standalone "
                f"rollout {rollout_gpus} (actor_rollout_ref.rollout.nnodes x n_gpus_per_node) and the reward workers "
                f"{reward_gpus:g} (reward.diffusion.num_workers x num_gpus_per_worker), the Ray cluster has "
                f"{available}: set trainer.colocate_rollout=true to put the rollout on the actor's GPUs, or "
                "reward.diffusion.resource_pool=actor for the reward models"
            )

    def _check_cpu_layout(self):
        """On CPU each actor rank and each replica's server reserves one logical CPU, and each reward worker with
        resources of its own ``num_cpus_per_worker``: a cluster with fewer leaves a placement group waiting."""
        from verl_omni.workers.config.rollout import replica_world_size
        from verl_omni.workers.rollout.vllm_omni.server import CPU_SERVER_NUM_CPUS

        trainer, rollout, reward = self.configs.trainer, self.config.actor_rollout_ref.rollout, self.configs.reward
        ranks = trainer.nnodes * trainer.n_gpus_per_node
        devices = ranks if self.colocate else rollout.nnodes * rollout.n_gpus_per_node
        replicas = devices // replica_world_size(rollout)
        reward_cpus = reward.num_workers * reward.num_cpus_per_worker if reward.resource_pool == "own" else 0.0
        needed = ranks + replicas * CPU_SERVER_NUM_CPUS + reward_cpus
        available = ray.cluster_resources().get("CPU", 0.0)
        if needed > available:
            raise ValueError(
                f"on CPU the run reserves {needed:g} logical CPUs: {ranks} actor ranks (trainer.nnodes x "
                f"trainer.n_gpus_per_node), {replicas} rollout replicas (actor_rollout_ref.rollout.nnodes x "
                f"n_gpus_per_node, or the ranks with trainer.colocate_rollout=true, over the rollout's "
                f"tensor_model_parallel_size x ulysses_sequence_parallel_size) and {reward_cpus:g} for the "
                f"reward workers (reward.diffusion.num_workers x num_cpus_per_worker); the Ray cluster has "
                f"{available:g}: start its nodes with more (ray start --num-cpus=N; a local run: "
                "ray_kwargs.ray_init.num_cpus=N) or ask for fewer ranks and replicas"
            )

    def _init_tokenizer(self):
        """The checkpoint's prompt tokenizer (the adapter's ``tokenizer_subfolder``), for verl's dataset."""
        self.tokenizer = self.configs.model.tokenizer
        self.processor = None

    def _init_dataloader(self):
        data = self.config.data
        self.train_dataset = create_prompt_dataset(data.train_files, data, self.tokenizer, is_train=True)
        self.train_dataloader = StatefulDataLoader(
            self.train_dataset,
            batch_size=data.train_batch_size,
            num_workers=data.dataloader_num_workers,
            drop_last=True,
            collate_fn=collate_fn,
            sampler=create_rl_sampler(data, self.train_dataset),
        )
        self.steps_per_epoch = len(self.train_dataloader)
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"data.train_files hold {len(self.train_dataset)} prompts, fewer than "
                f"data.train_batch_size={data.train_batch_size}"
            )
        trainer = self.configs.trainer
        self.total_training_steps = trainer.total_training_steps or self.steps_per_epoch * trainer.total_epochs
        self.val_dataloader = None
        if trainer.val_before_train or trainer.test_freq > 0:
            self.val_dataset = create_prompt_dataset(data.val_files, data, self.tokenizer, is_train=False)
            self.val_dataloader = StatefulDataLoader(
                self.val_dataset,
                batch_size=data.val_batch_size or len(self.val_dataset),
                num_workers=data.dataloader_num_workers,
                shuffle=False,
                collate_fn=collate_fn,
            )
        logger.info(
            "%d training prompts (%d steps per epoch), %d steps in total",
            len(self.train_dataset),
            self.steps_per_epoch,
            self.total_training_steps,
        )

    def _start_workers(self):
        """The actor, reward, rollout and agent-loop workers, started side by side where nothing orders them.

        Every worker process imports torch and verl before it does anything: tens of seconds each on a busy
        2-core machine, one after the other when each start waited for the last (docs/development.md,
        "Keeping the suite fast"). Here the actor's ranks load the model while the replicas start, and the agent-loop
        workers start with the replicas (``_init_rollout``). A standalone rollout needs nothing of the
        actor, so the actor's worker group (whose creation waits for its rank 0) starts in a thread beside
        it; a colocated one needs the group, and on accelerators the loaded model too (vLLM sizes its
        memory from what the actor left free). Reward workers in the actor's bundles, or on GPUs of their own
        (counted from what the actor's placement left), wait for the actor's worker group.
        """
        # the pool object only (its placement groups come with the worker group): the reward manager takes it
        self.resource_pool = self._actor_resource_pool()
        # a daemon thread: a start stuck for good must not keep the watchdog's error, or the exit, waiting on it
        actor = None if self.colocate else run_beside(self._init_actor, "actor_start")
        if actor is None:
            self._init_actor()
            if self.device != "cpu":
                self._actor_loaded()
        elif self.configs.reward.resource_pool == "actor" or self.configs.reward.gpus_of_own > 0:
            actor.result()  # in the actor's bundles, or counting the GPUs the actor's placement left
        self._init_reward()
        self._init_rollout()
        if actor is not None:
            actor.result()
        self._actor_loaded()
        self._log_placement()

    def _log_placement(self) -> None:
        """One line naming the node (id and IP) of each of the run's Ray workers (actor ranks, replicas, reward,
        agent-loop and routing workers): on several nodes it tells which workers a lost node took with it
        (:meth:`lost_worker_message` names them by it)."""
        workers = self._placed_workers()
        found = ray.get([handle.__ray_call__.remote(actor_location) for handle in workers.values()])
        self.worker_placement = {
            actor_id: f"{name} on {node}" for name, (actor_id, node) in zip(workers, found, strict=True)
        }
        logger.info("placement: %s", ", ".join(self.worker_placement.values()))

    def _placed_workers(self) -> dict:
        """Every Ray worker of the run by the name the placement line and the error of a lost one give it."""
        workers = {f"actor rank {i}": handle for i, handle in enumerate(self.actor_rollout_wg.workers)}
        workers |= {f"replica {i}": handle for i, handle in enumerate(self.llm_server_manager.server_handles)}
        workers |= {f"reward worker {i}": h for i, h in enumerate(self.reward_loop_manager.reward_loop_workers)}
        workers |= {f"agent-loop worker {i}": h for i, h in enumerate(self.agent_loop_manager.agent_loop_workers)}
        workers["request balancer"] = self.llm_server_manager.global_load_balancer
        return workers

    def phase_workers(self, phase: str) -> str:
        """The workers ``phase`` waits on, with their nodes once placed (the watchdog's report of a stalled phase)."""
        kinds = PHASE_WORKERS.get(phase)
        placement = getattr(self, "worker_placement", None)
        if kinds is None or placement is None:
            return "the actor ranks, rollout replicas, reward and agent-loop workers as they start"
        named = [where for where in placement.values() if where.startswith(kinds)]
        return ", ".join(named) or ", ".join(kinds)

    def lost_worker_message(self, error) -> str:
        """The error of a run whose Ray worker died or became unreachable (``RayActorError``): which worker, on
        which node, and what to do; a lost worker ends the run (no failover). A live worker's task that failed on a
        dead one arrives as a ``RayTaskError`` that is also a ``RayActorError``: its ``actor_id`` is the dead
        worker's (Ray reads the attributes of such an error from its cause)."""
        where = self.worker_placement.get(error.actor_id)
        worker = where or f"Ray actor {error.actor_id}"
        return (
            f"the run lost {worker}: its process or its node is gone ({type(error).__name__}, above). The run "
            "stops; start it again once the cluster has its nodes back: trainer.resume_mode=auto resumes from the "
            "newest complete checkpoint in trainer.default_local_dir"
        )

    def _actor_loaded(self) -> None:
        """Wait for the actor's ``init_model`` (started by ``_init_actor``); raises its error."""
        if self._actor_init is not None:
            refs, self._actor_init = self._actor_init, None
            ray.get(refs)

    def _actor_resource_pool(self):
        """The actor's devices: ``trainer.n_gpus_per_node`` on each of ``trainer.nnodes`` nodes."""
        from verl.single_controller.ray import RayResourcePool

        trainer = self.configs.trainer
        # on CPU each bundle reserves max_colocate_count logical CPUs: one per rank (docs/design.md, "verl on the CPU")
        colocate_count = {"max_colocate_count": 1} if self.device == "cpu" else {}
        return RayResourcePool(
            [trainer.n_gpus_per_node] * trainer.nnodes,
            use_gpu=self.device == "cuda",
            name_prefix="flowgrpo_actor",
            **colocate_count,
        )

    def _init_actor(self):
        """The actor (and its reference: the LoRA disabled, or a frozen copy) as a worker group over the actor's devices.

        The ranks' ``init_model`` is started, not waited for (``_actor_loaded``)."""
        from verl.single_controller.ray import RayClassWithInitArgs, RayWorkerGroup
        from verl.workers.config import TrainingWorkerConfig

        from verl_omni.workers.engine_workers import DiffusionActorWorker

        actor = self.configs.actor
        worker_config = TrainingWorkerConfig(
            model_type="diffusion_model",
            model_config=self.configs.model,
            engine_config=actor.engine,
            optimizer_config=replace(actor.optim, total_training_steps=self.total_training_steps),
            checkpoint_config=actor.checkpoint,
        )
        worker_cls = RayClassWithInitArgs(
            cls=ray.remote(DiffusionActorWorker),
            config=worker_config,
            actor_config=actor,
            algorithm_config=self.configs.algorithm,
        )
        # verl's checkpoint code calls the actor's worker group ``actor_rollout_wg``
        self.actor_rollout_wg = RayWorkerGroup(self.resource_pool, worker_cls, device_name=self.device)
        # init_model is ONE_TO_ALL: the same call on every rank
        self._actor_init = self.actor_rollout_wg.execute_all_async("init_model")

    def _init_reward(self):
        from verl_omni.reward_loop import DiffusionRewardLoopManager

        # the actor's pool: the reward workers share it when reward.diffusion.resource_pool=actor
        self.reward_loop_manager = DiffusionRewardLoopManager(self.config, rm_resource_pool=self.resource_pool)

    def _init_rollout(self):
        """vLLM-Omni replicas (on the actor's devices when colocated) and the agent loop over them.

        The balancer starts empty so that the agent-loop workers (on its client) start while the replicas
        do; the replicas join it when up."""
        from verl_omni.agent_loop import DiffusionAgentLoopManager
        from verl_omni.workers.rollout.llm_server import OmniLLMServerManager

        worker_group = self.actor_rollout_wg if self.colocate else None
        self.llm_server_manager = OmniLLMServerManager.create_empty(self.config, worker_group=worker_group)
        self.agent_loop_manager = DiffusionAgentLoopManager.create(
            self.config, self.get_llm_client(), reward_loop_worker_handles=self.get_reward_handles()
        )
        self.llm_server_manager.launch_replicas()
        # transformer batches each replica had run when last asked (rollout/requests_per_engine_batch)
        self._engine_batches_seen = [0] * len(self.llm_server_manager.server_handles)

"""Dataclass of the ``trainer`` node of ``flowgrpo_trainer.yaml`` (the ``algorithm`` node's dataclass is
the chosen algorithm's, :mod:`verl_omni.algorithms`).

The ``trainer`` keys keep verl's ``ppo_trainer.yaml`` names and meaning (the checkpoint and
resume code of verl's v1 trainer reads them); the diffusion-specific ones are documented here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from verl.base_config import BaseConfig

from verl_omni.trainer.config.watchdog import WatchdogConfig

LOGGER_BACKENDS = ("console", "file", "tensorboard", "wandb", "mlflow", "swanlab", "clearml", "trackio")
RESUME_MODES = ("auto", "disable", "resume_path")
# verl's ``trainer.v1.trainer_mode`` names: sync (generate, then train) and separate_async (generation of the next
# steps overlaps training, rollout and actor on separate devices; docs/guide/scale.md, "Separate-pools asynchronous
# mode")
TRAINER_MODES = ("sync", "separate_async")


@dataclass
class FlowGRPOTrainerConfig(BaseConfig):
    """The run: devices, length, logging, checkpoints, validation (``trainer``).

    Args:
        project_name (str): tracker project.
        experiment_name (str): tracker run name.
        logger (list[str]): ``Tracking`` backends: console, file (``metrics.jsonl`` under
            ``default_local_dir``), tensorboard (``tensorboard/`` under it), wandb, ...
        nnodes (int): nodes of the actor worker group.
        n_gpus_per_node (int): actor ranks per node (devices on GPU, processes on CPU).
        device (str | None): ``cuda`` or ``cpu``; None picks cuda when available.
        total_epochs (int): passes over the training prompts.
        total_training_steps (int | None): stop after this many steps (None: epochs decide).
        save_freq (int): checkpoint every this many steps and at the last one; <= 0 never.
        test_freq (int): validate every this many steps and at the last one; <= 0 never.
        val_before_train (bool): validate once before the first step.
        val_grid_images (int): at most this many validation images in the logged grid.
        default_local_dir (str): the run's directory: checkpoints, ``metrics.jsonl``, image grids.
        default_hdfs_dir (str | None): not supported (must be None).
        resume_mode (str): ``auto`` (resume the run in ``default_local_dir`` from its newest complete
            ``global_step_*``), ``disable`` (start a new run; refused when ``default_local_dir`` holds
            one), or ``resume_path`` (``resume_from_path``). See ``docs/guide/training.md``, "Output directory and
            resume".
        resume_from_path (str | None): a complete ``global_step_<N>`` directory, for ``resume_path``.
        overwrite_output_dir (bool): delete an earlier run found in ``default_local_dir``
            (``metrics.jsonl``, checkpoints, tracker, ``images/``, ``tensorboard/``) and start over;
            False refuses to start there unless the run resumes it.
        del_local_ckpt_after_load (bool): verl's key; must stay False.
        max_actor_ckpt_to_keep (int | None): keep this many newest complete checkpoints, delete older
            ones after each save; None keeps all.
        checkpoint_callback_class (str | None): verl's checkpoint callback hook (a class path).
        colocate_rollout (bool): place the rollout servers on the actor's devices (verl's
            colocated mode) and put them to sleep during the actor phases; False runs them
            standalone (side by side on a shared GPU, or on their own devices).
        builtin_dir (str): where ``builtin://`` paths (tiny model, built-in prompts) are built once.
        trainer_mode (str): ``sync`` (each step samples with the current weights, then trains) or
            ``separate_async`` (verl's name: rollout and actor on separate devices, the generation of the
            next steps runs while the actor trains; needs ``colocate_rollout=false``). ``docs/guide/scale.md``.
        seed (int): the run's seed. By default every seeded part of a run takes it, through the YAML
            (``${oc.select:trainer.seed,0}``): the actor's shuffling (``actor_rollout_ref.actor.seed``), the LoRA
            initialization (``actor_rollout_ref.actor.engine.seed``), every sample's rollout seed
            (``actor_rollout_ref.rollout.seed``, mixed with the step and row), the prompt order (``data.seed``) and
            an algorithm's own draws (``algorithm.seed``, DanceGRPO); each of those keys still overrides its own.
            verl has no run-wide seed; ``trainer`` holds the run's other settings. Default 0.
        max_staleness (int): ``separate_async``: how many updates a batch's sampling weights may lag the
            policy it trains (1 = one step off-policy: step k trains on samples of the weights before step
            k-1's update); also how many generations run ahead of training. Ignored by ``sync``.
        preempt_signals (list[str]): signals that ask the driver to checkpoint its last finished step and exit with
            status 143 (``docs/guide/training.md``, "Preemption"); a second one exits at once (137). Empty: the
            signals keep their default effect. Default SIGTERM, SIGINT, SIGUSR1.
        preempt_grace_s (float): after a preemption signal, a step that has not reached the actor yet still
            finishes when it is expected to within this many seconds (else it is dropped and the step before it is
            checkpointed). Set it below the scheduler's grace minus a checkpoint's time. Default 0: never wait.
        nan_policy (str): a NaN or Inf reward, advantage, loss or gradient norm: ``stop`` (raise naming the step and
            the source, before the step's checkpoint) or ``skip_step`` (drop the step's update, log it, count it in
            ``training/non_finite_steps_skipped``). Default ``stop``.
        watchdog (WatchdogConfig): how long each phase (engine start, generation, reward, actor replay and update,
            weight sync, checkpoint, validation) may go without finishing before the run fails naming it
            (:class:`~verl_omni.trainer.config.watchdog.WatchdogConfig`; ``docs/guide/training.md``, "Stalls").
    """

    project_name: str = "verl_omni"
    experiment_name: str = "flowgrpo"
    logger: list = field(default_factory=lambda: ["console", "file"])
    nnodes: int = 1
    n_gpus_per_node: int = 1
    device: str | None = None
    total_epochs: int = 1
    total_training_steps: int | None = None
    save_freq: int = -1
    test_freq: int = -1
    val_before_train: bool = True
    val_grid_images: int = 16
    default_local_dir: str = "outputs/flowgrpo"
    default_hdfs_dir: str | None = None
    resume_mode: str = "auto"
    resume_from_path: str | None = None
    overwrite_output_dir: bool = False
    del_local_ckpt_after_load: bool = False
    max_actor_ckpt_to_keep: int | None = None
    checkpoint_callback_class: str | None = None
    colocate_rollout: bool = False
    builtin_dir: str = "outputs/builtin"
    trainer_mode: str = "sync"
    max_staleness: int = 1
    seed: int = 0
    preempt_signals: list = field(default_factory=lambda: ["SIGTERM", "SIGINT", "SIGUSR1"])
    preempt_grace_s: float = 0.0
    nan_policy: str = "stop"
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)

    def __post_init__(self):
        backends = [self.logger] if isinstance(self.logger, str) else list(self.logger)
        unknown = [b for b in backends if b not in LOGGER_BACKENDS]
        if unknown:
            raise ValueError(f"trainer.logger has unknown backend(s) {unknown}; available: {list(LOGGER_BACKENDS)}")
        for key in ("save_freq", "test_freq"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"trainer.{key} must be an integer (<= 0: never), got {value!r}")
        for key in ("nnodes", "n_gpus_per_node", "total_epochs", "val_grid_images"):
            if getattr(self, key) < 1:
                raise ValueError(f"trainer.{key} must be >= 1, got {getattr(self, key)}")
        if self.total_training_steps is not None and self.total_training_steps < 1:
            raise ValueError(f"trainer.total_training_steps must be >= 1 or null, got {self.total_training_steps}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ValueError(f"trainer.seed must be an integer >= 0 (the run's seed), got {self.seed!r}")
        if self.trainer_mode not in TRAINER_MODES:
            raise ValueError(f"trainer.trainer_mode must be one of {TRAINER_MODES}, got {self.trainer_mode!r}")
        if not isinstance(self.max_staleness, int) or isinstance(self.max_staleness, bool) or self.max_staleness < 1:
            raise ValueError(
                f"trainer.max_staleness must be an integer >= 1 (1 = one step off-policy), got {self.max_staleness!r}; "
                "for on-policy training use trainer.trainer_mode=sync"
            )
        if self.trainer_mode == "separate_async" and self.colocate_rollout:
            raise ValueError(
                "trainer.trainer_mode=separate_async runs the rollout while the actor trains, on devices of its own: "
                "set trainer.colocate_rollout=false (or trainer.trainer_mode=sync)"
            )
        from verl_omni.trainer.diffusion.preemption import signal_number

        for name in self.preempt_signals:
            signal_number(str(name))
        if isinstance(self.preempt_grace_s, bool) or not isinstance(self.preempt_grace_s, int | float):
            raise ValueError(f"trainer.preempt_grace_s must be a number of seconds >= 0, got {self.preempt_grace_s!r}")
        if self.preempt_grace_s < 0:
            raise ValueError(f"trainer.preempt_grace_s must be >= 0 seconds, got {self.preempt_grace_s}")
        from verl_omni.trainer.diffusion.non_finite import NAN_POLICIES

        if self.nan_policy not in NAN_POLICIES:
            raise ValueError(f"trainer.nan_policy must be one of {NAN_POLICIES}, got {self.nan_policy!r}")
        if self.device not in (None, "cuda", "cpu"):
            raise ValueError(f"trainer.device must be 'cuda', 'cpu' or null (auto), got {self.device!r}")
        if self.resume_mode not in RESUME_MODES:
            raise ValueError(f"trainer.resume_mode must be one of {RESUME_MODES}, got {self.resume_mode!r}")
        if self.resume_mode == "resume_path" and "global_step_" not in str(self.resume_from_path):
            raise ValueError(
                f"trainer.resume_from_path={self.resume_from_path!r} must be a global_step_<N> checkpoint "
                "directory when trainer.resume_mode=resume_path"
            )
        if self.default_hdfs_dir is not None:
            raise ValueError("trainer.default_hdfs_dir is not supported by the diffusion checkpoints; set it to null")
        if self.del_local_ckpt_after_load:
            raise ValueError("trainer.del_local_ckpt_after_load is not supported; set it to False")
        if not self.default_local_dir:
            raise ValueError("trainer.default_local_dir must be a directory path")
        if self.max_actor_ckpt_to_keep is not None and self.max_actor_ckpt_to_keep < 1:
            raise ValueError(
                f"trainer.max_actor_ckpt_to_keep must be >= 1 or null (keep all), got {self.max_actor_ckpt_to_keep}"
            )

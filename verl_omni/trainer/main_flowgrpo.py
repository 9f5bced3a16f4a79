"""Flow-GRPO entry point: ``python -m verl_omni.trainer.main_flowgrpo [key=value ...]``.

Composes ``verl_omni/trainer/config/flowgrpo_trainer.yaml`` with Hydra, builds the ``builtin://``
paths (the tiny random Qwen-Image and the built-in prompts) once, runs the preflight (keys,
types, model files, data files, reward endpoints: seconds, no engine imported) and validates
every config node before Ray starts, then starts Ray (or joins ``ray_kwargs.ray_init.address``) and runs
:class:`RayFlowGRPOTrainer` in this process (with ``data.preference_files``, offline Diffusion-DPO's
``OfflinePreferenceTrainer``: the actor only). With no overrides it is the built-in CPU run
(``docs/guide/training.md``).
"""

from __future__ import annotations

import gc
import logging
import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

from verl_omni.utils.config import register_resolvers
from verl_omni.utils.console import SHOW_WARNINGS_ENV, quiet_third_party_output

# the YAML tree's hydra.searchpath names verl's config directory through a resolver (no verl import)
register_resolvers()

logger = logging.getLogger(__name__)

BUILTIN = "builtin://"
BUILTIN_KEYS = ("actor_rollout_ref.model.path", "data.train_files", "data.val_files")
# logical CPUs declared on a CPU-only machine: every actor rank, replica, reward and agent-loop
# worker reserves one; they time-share the physical cores
CPU_LOGICAL_CPUS = 16


def _builtin_path(name: str, builtin_dir: Path) -> str:
    """Build (once) what ``builtin://<name>`` names and return its local path."""
    if name == "tiny_qwen_image":
        path = builtin_dir / "tiny_qwen_image"
        if not (path / "model_index.json").is_file():
            from verl_omni.utils.tiny_models import build_tiny_model

            logger.info("building the tiny random Qwen-Image into %s (once)", path)
            build_tiny_model("qwen_image", path, seed=0)
        return str(path)
    if name in ("tiny_prompts/train.parquet", "tiny_prompts/val.parquet"):
        from verl_omni.utils.dataset.t2i_prompts import ensure_tiny_prompts

        train, val = ensure_tiny_prompts(builtin_dir / "tiny_prompts")
        return str(train if name.endswith("train.parquet") else val)
    raise ValueError(
        f"unknown built-in {BUILTIN}{name}; available: tiny_qwen_image, tiny_prompts/train.parquet, "
        "tiny_prompts/val.parquet"
    )


def resolve_builtin_paths(config: DictConfig) -> None:
    """Replace every ``builtin://`` value of :data:`BUILTIN_KEYS` by the built local path."""
    builtin_dir = Path(str(config.trainer.builtin_dir)).expanduser().absolute()
    with open_dict(config):
        for key in BUILTIN_KEYS:
            value = OmegaConf.select(config, key)
            if isinstance(value, str) and value.startswith(BUILTIN):
                OmegaConf.update(config, key, _builtin_path(value[len(BUILTIN) :], builtin_dir))


def init_ray(config: DictConfig, device: str) -> None:
    """Start a local Ray (or join ``ray_kwargs.ray_init.address``); workers import what this process imports."""
    import ray
    from verl.plugin.platform import get_platform
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    from verl_omni.utils.ray_start import init_local_ray
    from verl_omni.utils.reward_score.environment import CACHE_ENV_VAR

    if ray.is_initialized():
        return
    kwargs = {k: v for k, v in OmegaConf.to_container(config.ray_kwargs.ray_init).items() if v is not None}
    # RAY_ADDRESS joins a cluster as the address key does, and Ray refuses num_cpus when joining
    if device == "cpu" and "address" not in kwargs and not os.environ.get("RAY_ADDRESS"):
        kwargs.setdefault("num_cpus", CPU_LOGICAL_CPUS)
    runtime_env = get_ppo_ray_runtime_env(config)
    # with CACHE_ENV_VAR the workers find the scorer environments this process built
    for name in ("PYTHONPATH", SHOW_WARNINGS_ENV, CACHE_ENV_VAR):
        if os.environ.get(name):
            runtime_env["env_vars"][name] = os.environ[name]
    # actor ranks and rollout workers share NCCL weight groups (collective_share), whose members must agree on
    # NCCL's settings: verl starts the rollout servers with its platform's rollout_env_vars (on CUDA
    # NCCL_CUMEM_ENABLE=0; a mismatch fails the group with "Cuda failure 'invalid argument'"), so every worker gets them
    for name, value in get_platform().rollout_env_vars().items():
        runtime_env["env_vars"].setdefault(name, value)
    # each Ray worker drops the third-party noise of its imports, as this process does (docs/development.md)
    runtime_env["worker_process_setup_hook"] = "verl_omni.utils.console.quiet_third_party_output"
    # a busy machine can miss Ray's fixed 30 s node start-up wait: bounded attempts (utils/ray_start.py)
    init_local_ray(runtime_env=runtime_env, include_dashboard=False, **kwargs)


def keep_log_level() -> None:
    """Stop an import from raising the root logger to ERROR, which hides the trainer's progress lines.

    vLLM's serving routers import ``model_hosting_container_standards``, which sets the root logger
    and its handlers to ``SAGEMAKER_CONTAINER_LOG_LEVEL`` (default ERROR) at import time; the
    trainer imports vLLM lazily, after Hydra configured logging. Keep the level Hydra set unless
    the variable was given.
    """
    os.environ.setdefault(
        "SAGEMAKER_CONTAINER_LOG_LEVEL", logging.getLevelName(logging.getLogger().getEffectiveLevel())
    )


def run_flowgrpo(config: DictConfig) -> None:
    """Resolve, preflight (seconds, no engine imported), validate, start Ray, train.

    The trainer, verl's worker stack and vLLM are imported only after the config passed: a bad
    value or file fails before the imports that take most of a start-up (``docs/guide/training.md``).
    """
    keep_log_level()
    from verl_omni.trainer.config.preflight import check_config, check_resources

    check_config(config)
    resolve_builtin_paths(config)
    check_resources(config)
    from verl_omni.trainer.config.validation import build_scorer_environments, validate_config
    from verl_omni.trainer.diffusion.run_dir import open_run_dir

    configs = validate_config(config)
    build_scorer_environments(configs.reward)
    run_dir = open_run_dir(configs.trainer)  # refuses to mix with an earlier run, before the heavy imports
    import torch

    from verl_omni.trainer.diffusion.async_mode import trainer_class
    from verl_omni.trainer.diffusion.reward_guard import GuardStop
    from verl_omni.utils.exit_codes import EXIT_GUARD_STOP

    init_ray(config, configs.trainer.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if OmegaConf.select(config, "data.preference_files", default=None) is not None:
        from verl_omni.trainer.diffusion.offline_preferences import OfflinePreferenceTrainer as cls
    else:
        cls = trainer_class(configs.trainer.trainer_mode)
    trainer = cls(config, configs, run_dir)
    # after ray.init, whose driver SIGTERM handler exits mid-step: a signal now asks for a checkpoint and a clean stop
    trainer.preemption.install(list(configs.trainer.preempt_signals), on_force=run_dir.lock.release)
    from ray.exceptions import RayActorError

    from verl_omni.trainer.diffusion.preemption import Preempted

    trainer.init()
    try:
        trainer.fit()
    except Preempted as stop:
        stop_preempted(trainer, stop)
    except KeyboardInterrupt:
        # Ctrl-C with SIGINT left out of trainer.preempt_signals: what the run did so far, then stop as interrupted
        trainer.write_summary(interrupted=True)
        raise
    except RayActorError as e:  # a worker's process or node died: name it and where it ran
        raise RuntimeError(trainer.lost_worker_message(e)) from e
    except GuardStop as stop:  # a deliberate stop, told apart from a crash by its exit status
        print(stop, file=sys.stderr, flush=True)
        raise SystemExit(EXIT_GUARD_STOP) from None
    except Exception as e:
        # a phase that reports a dead worker in its own words (the weight sync names the server that failed) still
        # ends with the lost worker's name and node
        lost = lost_worker_cause(e, RayActorError)
        if lost is None:
            raise
        raise RuntimeError(trainer.lost_worker_message(lost)) from e


def lost_worker_cause(error: BaseException, kind: type) -> BaseException | None:
    """The first ``kind`` (Ray's error for a dead worker) in ``error``'s chain of causes, or None."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, kind):
            return error
        seen.add(id(error))
        error = error.__cause__
    return None


def stop_preempted(trainer, stop) -> None:
    """A preempted run's exit: the summary so far, the lock released, Ray shut down, :data:`EXIT_PREEMPTED`.

    A second signal during this exits at once (``preemption.py``): nothing here writes a checkpoint.
    """
    import ray

    from verl_omni.utils.exit_codes import EXIT_PREEMPTED

    logger.warning("%s; exiting with status %d", stop, EXIT_PREEMPTED)
    trainer.write_summary(interrupted=True)
    trainer.run_dir.lock.release()
    ray.shutdown()
    raise SystemExit(EXIT_PREEMPTED)


@hydra.main(config_path="config", config_name="flowgrpo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    quiet_third_party_output()
    run_flowgrpo(config)


def freeze_heap_for_exit() -> None:
    """The process is about to exit: move every tracked object to the collector's permanent generation.

    Interpreter shutdown runs the cyclic collector over the whole heap (several passes while it tears the
    modules down); after a run that heap is torch, verl, vLLM and diffusers, and the passes take about 3 s
    of CPU and wall on 2 cores (``py-spy dump --native``: ``gc_collect_main`` after ``ray.shutdown``).
    Frozen objects are not scanned; objects are still freed by their reference counts, atexit handlers and
    stream flushes still run: only cyclic garbage left at exit is not collected, which the OS reclaims."""
    gc.freeze()


if __name__ == "__main__":
    main()
    freeze_heap_for_exit()

"""Every config node of ``main_flowgrpo`` as its dataclass, plus the cross-node rules, checked before Ray starts.

A bad value fails here, in the driver, with the dotted key in the message, instead of minutes
later inside a Ray worker. ``builtin://`` paths must be resolved first (``main_flowgrpo``). The files
and endpoints a run reads are checked by the preflight (``preflight.py``), which runs before this.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf
from verl.utils.config import omega_conf_to_dataclass

from verl_omni.algorithms import (
    SDE_WINDOW,
    Algorithm,
    AlgorithmConfig,
    algorithm_config_from,
    check_model_supports,
    get_algorithm,
)
from verl_omni.trainer.config.config import FlowGRPOTrainerConfig
from verl_omni.workers.config.actor import DiffusionActorConfig
from verl_omni.workers.config.model import DiffusionModelConfig
from verl_omni.workers.config.reward import DiffusionRewardConfig
from verl_omni.workers.config.reward_guard import RewardGuardConfig
from verl_omni.workers.config.rollout import DiffusionRolloutConfig, weight_transport_for

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunConfigs:
    """The validated dataclasses of one run (the DictConfig stays the source for verl's code)."""

    actor: DiffusionActorConfig
    model: DiffusionModelConfig
    rollout: DiffusionRolloutConfig
    reward: DiffusionRewardConfig
    algorithm: AlgorithmConfig
    trainer: FlowGRPOTrainerConfig
    guard: RewardGuardConfig = field(default_factory=RewardGuardConfig)

    @property
    def algorithm_cls(self) -> type[Algorithm]:
        """The registered algorithm ``algorithm.name`` names."""
        return get_algorithm(self.algorithm.name)

    @property
    def dp_size(self) -> int:
        """Actor ranks over all nodes."""
        return self.trainer.nnodes * self.trainer.n_gpus_per_node


def _node(config: DictConfig, key: str, dataclass_type: type | None = None):
    """``config.<key>`` as its dataclass; errors get the node's dotted key in front."""
    node = OmegaConf.select(config, key)
    if node is None:
        raise ValueError(f"{key} is missing from the config")
    try:
        if dataclass_type is not None and hasattr(dataclass_type, "from_config"):
            return dataclass_type.from_config(node)
        return omega_conf_to_dataclass(node, dataclass_type)
    except Exception as e:  # hydra wraps the dataclass' ValueError in InstantiationException
        cause = e.__cause__ if e.__cause__ is not None and "Error in call to target" in str(e) else e
        raise ValueError(f"{key}: {cause}") from e


def _guard_node(config: DictConfig) -> RewardGuardConfig:
    """``reward.guard`` (absent: the guard off), with the dotted key in front of its errors."""
    try:
        return RewardGuardConfig.from_config(OmegaConf.select(config, "reward.guard"))
    except ValueError as e:
        message = str(e)
        raise ValueError(message if message.startswith("reward.guard") else f"reward.guard: {message}") from None


def _check_batches(config: DictConfig, configs: RunConfigs) -> None:
    n = configs.rollout.n
    if n < 2:
        raise ValueError(
            f"actor_rollout_ref.rollout.n={n}: group advantages need at least 2 samples per prompt "
            "(a group of 1 has advantage 0 and trains nothing)"
        )
    prompts = config.data.train_batch_size
    if not isinstance(prompts, int) or prompts < 1:
        raise ValueError(f"data.train_batch_size must be an integer >= 1, got {prompts!r}")
    if configs.actor.rollout_n != n:
        raise ValueError(
            f"actor_rollout_ref.actor.rollout_n={configs.actor.rollout_n} must equal actor_rollout_ref.rollout.n={n} "
            "(leave it unset: the YAML mirrors rollout.n)"
        )
    mini = configs.actor.ppo_mini_batch_size
    if prompts % mini:
        raise ValueError(
            f"actor_rollout_ref.actor.ppo_mini_batch_size={mini} counts prompts per optimizer step (verl's unit; "
            f"{mini} * rollout.n = {mini * n} samples) and must divide the prompts per step data.train_batch_size="
            f"{prompts}: set it to a divisor of {prompts}"
        )
    try:
        configs.actor.validate(configs.dp_size)
    except ValueError as e:
        raise ValueError(
            f"actor_rollout_ref.{e} (data-parallel size = trainer.nnodes * trainer.n_gpus_per_node)"
        ) from e


def _check_phases(configs: RunConfigs) -> None:
    configs.algorithm_cls.check(configs)
    if configs.model.lora.rank == 0 and configs.model.adapter.rollout_weight_prefix is None:
        raise ValueError(
            f"actor_rollout_ref.model.lora.rank=0 (full fine-tuning) needs a full-weight sync to the rollout, which "
            f"{configs.model.adapter.__name__} ({configs.model.path}) does not have yet: train a LoRA (rank > 0)"
        )


def _check_merge_lora(configs: RunConfigs) -> None:
    """The merged LoRA travels as full fine-tuning's buckets do: the model's rollout must take them."""
    if configs.model.lora.merge and configs.model.adapter.rollout_weight_prefix is None:
        raise ValueError(
            f"actor_rollout_ref.model.lora.merge=true needs a full-weight sync to the rollout, which "
            f"{configs.model.adapter.__name__} ({configs.model.path}) does not have yet: set "
            "actor_rollout_ref.model.lora.merge=false (the rollout serves the adapter)"
        )


def _check_ema(configs: RunConfigs) -> None:
    """The EMA of the weights averages the full transformer (``DiffusionActorConfig.ema_decay`` says why not a LoRA)."""
    if configs.actor.ema_decay > 0 and configs.model.lora.rank > 0:
        raise ValueError(
            f"actor_rollout_ref.actor.ema_decay={configs.actor.ema_decay} averages the full transformer, but "
            f"actor_rollout_ref.model.lora.rank={configs.model.lora.rank} trains a LoRA: set "
            "actor_rollout_ref.model.lora.rank=0 (full fine-tuning) or actor_rollout_ref.actor.ema_decay=0"
        )


def _resolve_model_defaults(config: DictConfig, configs: RunConfigs) -> None:
    """Settings left null for the model to fill (``sde_window_size``: the model's window range) become numbers
    here, once, before Ray: the driver's checks, the algorithm's and every worker's config then read the same."""
    if configs.rollout.sde_window_size is not None:
        return
    # the same context as _check_model's, so a setting the model refuses is named with the model either way
    context = f"actor_rollout_ref.model.path={configs.model.path}, algorithm={configs.algorithm.name}"
    spec = configs.rollout.sampling_spec(adapter=configs.model.adapter, model=context)
    object.__setattr__(configs.rollout, "sde_window_size", spec.sde_window_size)
    OmegaConf.update(config, "actor_rollout_ref.rollout.sde_window_size", spec.sde_window_size)


def _check_model(configs: RunConfigs) -> None:
    """What the model adapter requires of the rollout and actor settings."""
    adapter = configs.model.adapter
    # the sampling spec refuses what the model cannot honour (size multiple, guidance style, model_kwargs)
    specs = [
        configs.rollout.sampling_spec(
            v, adapter, f"actor_rollout_ref.model.path={configs.model.path}, algorithm={configs.algorithm.name}"
        )
        for v in (False, True)
    ]
    if configs.algorithm_cls.rollout_record == SDE_WINDOW and not specs[0].noise_level > 0:
        # the trained steps of an SDE window must be stochastic (an ODE rollout records no window)
        raise ValueError(
            f"actor_rollout_ref.rollout.noise_level must be > 0 for algorithm={configs.algorithm.name} (its rollout "
            "records an SDE window); 0 samples the ODE"
        )
    actor = configs.actor
    if actor.rollout_is_truncated and not configs.algorithm_cls.uses_log_probs:
        raise ValueError(
            f"actor_rollout_ref.actor.rollout_correction.loss_type=reinforce weighs a ratio to the rollout's "
            f"log-probs, and algorithm={configs.algorithm.name}'s loss reads no log-probs: leave loss_type=ppo_clip"
        )
    if (
        actor.use_rollout_log_probs
        and not actor.rollout_is_truncated
        and adapter.rollout_dtype not in (None, "float32")
    ):
        raise ValueError(
            f"actor_rollout_ref.actor.use_rollout_log_probs=true with {adapter.__name__}: its rollout computes in "
            f"{adapter.rollout_dtype} on every device, so its log-probs differ from the actor's by more than the "
            "clip range allows (docs/guide/models.md); set actor_rollout_ref.actor.use_rollout_log_probs=false so the "
            "actor recomputes log pi_old, or actor_rollout_ref.actor.rollout_correction.loss_type=reinforce (a "
            "truncated importance weight, which tolerates the gap)"
        )


def _check_sequence_parallel(configs: RunConfigs) -> None:
    """The replay's Ulysses degree against the model (can it split, its heads) and the GPUs of a node."""
    from verl_omni.workers.engine.fsdp.sequence_group import check_sequence_parallel

    check_sequence_parallel(
        configs.model.adapter,
        configs.model.path,
        configs.actor.ulysses_sequence_parallel_size,
        configs.trainer.n_gpus_per_node,
    )


def _check_rollout_sequence_parallel(configs: RunConfigs) -> None:
    """The rollout's Ulysses degree against the model (can its rollout transformer split, its heads) and the devices
    of a node that the replicas share: the actor's when colocated, the rollout's own otherwise."""
    from verl_omni.workers.config.rollout import SEQUENCE_PARALLEL_KEY
    from verl_omni.workers.engine.fsdp.sequence_group import check_sequence_parallel

    trainer, rollout = configs.trainer, configs.rollout
    if trainer.colocate_rollout:
        per_node, devices = (
            trainer.n_gpus_per_node,
            "devices per node of the colocated rollout (trainer.n_gpus_per_node)",
        )
    else:
        per_node, devices = (
            rollout.n_gpus_per_node,
            "rollout devices per node (actor_rollout_ref.rollout.n_gpus_per_node)",
        )
    check_sequence_parallel(
        configs.model.adapter,
        configs.model.path,
        rollout.ulysses_sequence_parallel_size,
        per_node,
        key=SEQUENCE_PARALLEL_KEY,
        splits=configs.model.adapter.rollout_supports_sequence_parallel,
        devices=devices,
    )


def _check_mode(configs: RunConfigs) -> None:
    """``separate_async``: the ratio's denominator is the sampling policy's log-prob, which the rollout records."""
    if configs.trainer.trainer_mode != "separate_async":
        return
    algorithm = configs.algorithm_cls
    if not algorithm.uses_log_probs or algorithm.old_policy_adapter:
        raise ValueError(
            f"trainer.trainer_mode=separate_async needs an algorithm whose ratio divides by the sampling policy's "
            f"log-prob (e.g. algorithm=flow_grpo); algorithm={configs.algorithm.name} keeps its own old policy"
        )
    if not configs.actor.use_rollout_log_probs:
        raise ValueError(
            "trainer.trainer_mode=separate_async trains on samples of earlier weights: set "
            "actor_rollout_ref.actor.use_rollout_log_probs=true so the ratio divides by the log-prob of the weights "
            "that sampled (the actor's recompute of those weights is logged as old_log_prob/rollout_diff_max)"
        )


def _check_offline_preferences(config: DictConfig, configs: RunConfigs) -> None:
    """``data.preference_files``: Diffusion-DPO on the files' pairs, each a group of two samples, and no rollout
    engine, so nothing that needs one (validation, the async trainer, per-scorer rewards)."""
    if OmegaConf.select(config, "data.preference_files", default=None) is None:
        return
    name, trainer, adapter = configs.algorithm.name, configs.trainer, configs.model.adapter
    refusals = [
        (name != "diffusion_dpo", f"trains Diffusion-DPO: set algorithm=diffusion_dpo (got algorithm={name})"),
        (
            configs.rollout.n != 2,
            f"makes each pair a group of two samples: set actor_rollout_ref.rollout.n=2 (got {configs.rollout.n})",
        ),
        (
            trainer.val_before_train or trainer.test_freq > 0,
            "starts no rollout engine, which validation samples with: set trainer.val_before_train=false and "
            f"trainer.test_freq=0 (got {trainer.val_before_train} and {trainer.test_freq})",
        ),
        (
            trainer.trainer_mode != "sync",
            f"has no rollout to run ahead: set trainer.trainer_mode=sync (got {trainer.trainer_mode})",
        ),
        (
            configs.algorithm.reward_normalization != "sum",
            "has no scorers (the pair says which image is preferred): set algorithm.reward_normalization=sum",
        ),
        (
            getattr(configs.algorithm, "pairing", None) == "margin" and configs.algorithm.reward_margin >= 1,
            "scores a pair's chosen image 1 and its rejected one 0: algorithm.reward_margin must be < 1 "
            f"(got {getattr(configs.algorithm, 'reward_margin', None)})",
        ),
        (
            adapter.preference_encoder is None,
            f"encodes the images with the model's preference encoder, which {adapter.__name__} "
            f"({configs.model.path}) does not have: train this model online (data.preference_files=null)",
        ),
    ]
    for refused, why in refusals:
        if refused:
            raise ValueError(f"data.preference_files (offline Diffusion-DPO) {why}")


def _check_source_images(config: DictConfig, configs: RunConfigs) -> None:
    """A model that takes source images (an editor, an image-to-video model) reads them from every prompt set's
    ``data.image_key`` column: a set without one (a text prompt set) would fail each request once Ray runs."""
    adapter = configs.model.adapter
    if not adapter.max_source_images or OmegaConf.select(config, "data.preference_files", default=None) is not None:
        return
    import pyarrow.parquet as pq

    image_key = str(OmegaConf.select(config, "data.image_key", default=None) or "images")
    keys = ["data.train_files"]
    if configs.trainer.val_before_train or configs.trainer.test_freq > 0:
        keys.append("data.val_files")
    for key in keys:
        files = OmegaConf.select(config, key)
        for file in list(files) if isinstance(files, ListConfig | list | tuple) else [files]:
            path = Path(str(file)).expanduser()
            # a missing or unreadable file is the preflight's to name
            if path.is_file() and image_key not in pq.read_schema(path).names:
                raise ValueError(
                    f"{key}: {file} has no source-image column {image_key!r} (data.image_key), and {adapter.__name__} "
                    f"({configs.model.path}) takes 1 to {adapter.max_source_images} source images per prompt: write "
                    "a set with images (examples/data_process/edit_prompts.py) or set data.image_key to its column"
                )


def _check_device(trainer: FlowGRPOTrainerConfig) -> None:
    import torch

    if trainer.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("trainer.device=cuda but no CUDA device is visible; use trainer.device=cpu or null")


def _check_reward_manager(config: DictConfig) -> None:
    from verl_omni.reward_loop.reward_loop import diffusion_manager_cls

    try:
        diffusion_manager_cls(config)
    except ValueError as e:
        raise ValueError(str(e)) from None


def validate_config(config: DictConfig) -> RunConfigs:
    """Build and cross-check every node; raises ``ValueError`` naming the key at the first problem."""
    configs = RunConfigs(
        trainer=_node(config, "trainer"),
        algorithm=algorithm_config_from(OmegaConf.select(config, "algorithm")),
        model=_node(config, "actor_rollout_ref.model"),
        actor=_node(config, "actor_rollout_ref.actor"),
        rollout=_node(config, "actor_rollout_ref.rollout"),
        reward=_node(config, "reward.diffusion", DiffusionRewardConfig),
        guard=_guard_node(config),
    )
    # the algorithm x model pairing first: the algorithm's own rules may not even apply to a model that cannot run it
    check_model_supports(configs.algorithm_cls, configs.model.adapter, configs.model.path)
    # an offline preference run's rules first: they name the algorithm and settings it needs
    _check_offline_preferences(config, configs)
    _check_source_images(config, configs)
    _resolve_model_defaults(config, configs)
    _check_device(configs.trainer)
    _check_reward_manager(config)
    _check_batches(config, configs)
    _check_phases(configs)
    _check_ema(configs)
    _check_merge_lora(configs)
    _check_model(configs)
    _check_sequence_parallel(configs)
    _check_rollout_sequence_parallel(configs)
    _check_mode(configs)
    # a forced weight transport fits the placement (a null device is checked again once resolved)
    rollout, trainer = configs.rollout, configs.trainer
    weight_transport_for(
        rollout.weight_transport, trainer.colocate_rollout, trainer.device, rollout.ulysses_sequence_parallel_size
    )
    return configs


def build_scorer_environments(reward: DiffusionRewardConfig) -> None:
    """Build (or find in the cache) the environment of every configured scorer that declares requirements, before
    Ray starts: a requirement that cannot install fails here, naming the scorer and the package, not in a worker."""
    from verl_omni.utils.reward_score import get_scorer_cls
    from verl_omni.utils.reward_score.environment import ScorerEnvironmentError, build

    for i, scorer in enumerate(reward.scorers):
        environment = get_scorer_cls(scorer.type).environment()
        if environment is None:
            continue
        requirements = ", ".join(environment.requirements)
        logger.info("building (or reusing) the environment of scorer %r: %s", scorer.label, requirements)
        try:
            build(environment)
        except ScorerEnvironmentError as e:
            raise ScorerEnvironmentError(
                f"reward.diffusion.scorers[{i}] ({scorer.type!r}): its environment cannot be built: {e}"
            ) from None

"""The algorithm contract: everything the trainer, the actor and the engine ask of an RL algorithm.

An algorithm is one module of :mod:`verl_omni.algorithms` (``<name>.py``) holding three things:

* a config dataclass (subclass of :class:`AlgorithmConfig`), the ``algorithm`` node, chosen with
  the Hydra group ``algorithm=<name>`` (``verl_omni/trainer/config/algorithm/<name>.yaml``);
* a loss class (subclass of :class:`AlgorithmLoss`): the loss of one replayed step, the batch keys it
  reads and how each of its metrics reduces over micro-batches, steps and ranks;
* an :class:`Algorithm` subclass, decorated with ``@register_algorithm("<name>")``, stating facts as
  class attributes (what the rollout records, which loss, which config) and doing the per-run work in
  class methods (the advantage, the phases, the cross-node checks).

The trainer loop, the actor, the engine and the replay read these declarations, computed once when
they are built; none of them tests an algorithm name (``docs/extending/algorithm.md``). Built-in algorithms
register on the first lookup (every module of this package is imported); an out-of-tree one is an
installed distribution with an entry point ``<name> = "<module>:<AlgorithmClass>"`` in the group
:data:`ALGORITHM_ENTRY_POINT_GROUP`, loaded when its name is first looked up.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from verl.base_config import BaseConfig

from verl_omni.algorithms.reward_normalization import REWARD_NORMALIZATIONS
from verl_omni.pipelines.model_base import ROLLOUT_RECORDS, SDE_WINDOW
from verl_omni.utils.registry import Registry, import_submodules

logger = logging.getLogger(__name__)

ALGORITHMS_PACKAGE = "verl_omni.algorithms"
ALGORITHM_ENTRY_POINT_GROUP = "verl_omni.algorithms"
DEFAULT_ALGORITHM = "flow_grpo"


# a per-sample int64 key of an update batch: samples with the same value are noised with the same ε at a replayed
# step of the ode_samples replay (a preference pair's two samples, whose errors compare only at one noise); absent,
# every sample draws its own
NOISE_GROUP_KEY = "noise_group"

# how a metric's values (one per replayed step and micro-batch, on every rank) become one number
REDUCTIONS = ("mean", "sum", "max", "min")


@dataclass
class AlgorithmConfig(BaseConfig):
    """Base of every ``algorithm`` node: the algorithm's registered name and the keys every algorithm has;
    subclasses add their keys (and call ``super().__post_init__()``).

    Args:
        name (str): the registered algorithm (``flow_grpo``, ``grpo_guard``, ...); the Hydra group
            ``algorithm=<name>`` sets it together with the algorithm's other keys.
        drop_zero_std_groups (bool): leave the samples of prompt groups whose rewards are all equal out of
            the update: the loss is the mean over the other samples (default False: over all samples, the
            equal groups adding zero-advantage terms). A step where every group is such a group makes no
            update. The Flow-GRPO authors' training script filters them (``docs/guide/algorithms.md``).
        reward_normalization (str): how several scorers' rewards become the score the advantage reads: ``sum``
            (default: the weighted mean of the raw rewards) or ``gdpo`` (each scorer normalised within the prompt
            group first, then the weighted mean; :mod:`verl_omni.algorithms.reward_normalization`).
    """

    name: str = DEFAULT_ALGORITHM
    drop_zero_std_groups: bool = False
    reward_normalization: str = "sum"

    def __post_init__(self):
        if not isinstance(self.drop_zero_std_groups, bool):
            raise ValueError(f"algorithm.drop_zero_std_groups must be true or false, got {self.drop_zero_std_groups!r}")
        if self.reward_normalization not in REWARD_NORMALIZATIONS:
            raise ValueError(
                f"algorithm.reward_normalization must be one of {REWARD_NORMALIZATIONS}, got "
                f"{self.reward_normalization!r}"
            )

    def require_positive(self, *keys: str) -> None:
        """Refuse a key of ``keys`` that is not > 0 (clip ranges, scales), naming it."""
        for key in keys:
            if not getattr(self, key) > 0:
                raise ValueError(f"algorithm.{key} must be > 0, got {getattr(self, key)}")

    def require_fraction(self, key: str) -> None:
        """Refuse ``key`` outside (0, 1] (a share of the recorded steps), naming it."""
        if not 0 < getattr(self, key) <= 1:
            raise ValueError(f"algorithm.{key} must be in (0, 1], got {getattr(self, key)}")


@dataclass(frozen=True)
class Phases:
    """Which optional phases of a step run, decided once per run from the algorithm and the actor config.

    Args:
        old_log_prob: the actor recomputes the old policy's replay outputs (``old_log_prob`` phase).
        reference: the actor replays the reference policy (``ref`` phase: the LoRA disabled, or with full
            fine-tuning the frozen base copy), for a KL term.
        old_outputs: what the ``old_log_prob`` phase keeps of the old policy's replay, each stored in the
            batch as ``old_<name>`` (``log_probs`` -> ``old_log_probs``, ``prev_sample_mean`` ->
            ``old_prev_sample_mean``).
        old_policy_adapter: the actor keeps the old policy as a second LoRA adapter on the same base, an EMA
            of the trained one, updated after each update with :meth:`Algorithm.old_policy_decay`.
        reference_in_update: each replayed step of the update also predicts the reference policy's velocity at the
            same input, without gradient (the LoRA disabled, or full fine-tuning's frozen copy, which the engine then
            builds), for a loss that compares the two at the very noise
            it trains on (Diffusion-DPO); a separate ``ref`` phase could not, its noise being drawn anew.
    """

    old_log_prob: bool = True
    reference: bool = False
    old_outputs: tuple[str, ...] = ("log_probs",)
    old_policy_adapter: bool = False
    reference_in_update: bool = False


@dataclass(frozen=True)
class UpdateRows:
    """How an algorithm lays out the step's update batch (:meth:`Algorithm.arrange_update`).

    The layout keeps the batch's size, so the data-parallel, mini- and micro-batch divisions still hold; the rows
    it does not train on are left out of the loss by the ``sample_mask`` (:mod:`verl_omni.workers.utils.sample_mask`).

    Args:
        order (`torch.Tensor`, ``[B]`` long): the step's sample each update row is (a sample may appear twice).
        keep (`torch.Tensor`, ``[B]`` bool): the update rows the loss trains on.
        keys (`dict[str, torch.Tensor]`): per-row tensors ``[B]`` of the update rows that the loss reads.
        metrics (`dict[str, float]`): logged with the step's metrics.
    """

    order: torch.Tensor
    keep: torch.Tensor
    keys: dict[str, torch.Tensor]
    metrics: dict[str, float]

    def __post_init__(self):
        size = self.order.shape[0]
        wrong = {k: tuple(v.shape) for k, v in {"keep": self.keep, **self.keys}.items() if tuple(v.shape) != (size,)}
        if self.order.ndim != 1 or wrong:
            raise ValueError(f"UpdateRows: order must be [B] and keep and every key [B] too; got {wrong}")


class AlgorithmLoss:
    """The loss of one replayed step: ``loss(replayed, micro_batch, step) -> (loss, metrics)``.

    Built once per actor from the actor config and the ``algorithm`` node; the engine calls it once
    per (micro-batch, replayed step) and back-propagates ``loss`` weighted by the micro-batch's share
    of the mini-batch. ``metrics`` are Python floats; the actor reduces each with the reduction declared
    in :attr:`metric_reductions` (a metric not declared there is averaged) and reports it as ``actor/<name>``.

    Class attributes:
        metric_reductions (`Mapping[str, str]`): metric name -> one of :data:`REDUCTIONS`: every metric the loss may
            report; an instance narrows it to those its configuration reports (each declared metric is logged).
        first_epoch_metrics (`tuple[str]`): metrics meaningful only before the first optimizer step of an
            update (e.g. the gap to the rollout's log-probs); later epochs drop them.
    """

    metric_reductions: ClassVar[Mapping[str, str]] = {}
    first_epoch_metrics: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        bad = {k: v for k, v in cls.metric_reductions.items() if v not in REDUCTIONS}
        if bad:
            raise TypeError(f"{cls.__name__}.metric_reductions {bad}: each reduction must be one of {REDUCTIONS}")

    def __init__(self, actor_config, algorithm_config: AlgorithmConfig):
        self.actor_config = actor_config
        self.algorithm_config = algorithm_config

    @property
    def required_keys(self) -> tuple[str, ...]:
        """Per-sample batch keys the loss reads besides the replayed trajectory (the trainer sends exactly these)."""
        raise NotImplementedError(f"{type(self).__name__} must declare required_keys")

    def check_batch(self, micro_batch) -> None:
        """Raise ``KeyError`` naming every required key the batch lacks and the phase that makes it."""
        missing = [k for k in self.required_keys if k not in micro_batch.keys()]
        if missing:
            raise KeyError(
                f"update batch lacks {missing} for {type(self).__name__}; the trainer's phases produce them "
                "(old_log_prob, ref, adv) as the algorithm declares"
            )

    def replay_steps(self, num_steps: int) -> Sequence[int]:
        """The recorded steps trained on (all of them by default; an algorithm may train on a subset)."""
        return range(num_steps)

    def __call__(self, replayed, micro_batch, step: int) -> tuple[torch.Tensor, dict[str, float]]:
        raise NotImplementedError


class Algorithm:
    """Base of every registered algorithm: facts as class attributes, per-run work as class methods.

    Class attributes:
        name (`str`): the registered name (set by :func:`register_algorithm`).
        title (`str`): the algorithm's name in prose (``Flow-GRPO``), read from the class itself only (a
            subclass registered under another name states its own; see :meth:`display_name`).
        config_cls (`type[AlgorithmConfig]`): dataclass of the ``algorithm`` node.
        loss_cls (`type[AlgorithmLoss]`): the per-step loss.
        rollout_record (`str`): what the rollout must record, one of :data:`ROLLOUT_RECORDS`; a model
            adapter lists the records its rollout pipeline can make (``ModelAdapter.rollout_records``).
        uses_log_probs (`bool`): the loss reads log π_old of the recorded transitions (from the rollout or
            recomputed by the ``old_log_prob`` phase).
        old_outputs (`tuple[str]`): what the ``old_log_prob`` phase keeps of the old policy's replay
            (see :class:`Phases`).
        needs_old_log_prob_recompute (`bool`): the loss needs more of the old policy than the rollout
            records, so the ``old_log_prob`` phase runs even when ``actor.use_rollout_log_probs`` is set.
        old_policy_adapter (`bool`): the old policy is an EMA adapter beside the trained LoRA
            (see :class:`Phases`; the decay is :meth:`old_policy_decay`).
        reference_in_update (`bool`): the update's replay predicts the reference velocity beside the trained one
            (see :class:`Phases`).
    """

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""
    config_cls: ClassVar[type[AlgorithmConfig]] = AlgorithmConfig
    loss_cls: ClassVar[type[AlgorithmLoss]] = AlgorithmLoss
    rollout_record: ClassVar[str] = SDE_WINDOW
    uses_log_probs: ClassVar[bool] = True
    old_outputs: ClassVar[tuple[str, ...]] = ("log_probs",)
    needs_old_log_prob_recompute: ClassVar[bool] = False
    old_policy_adapter: ClassVar[bool] = False
    reference_in_update: ClassVar[bool] = False

    @classmethod
    def display_name(cls) -> str:
        """The ``title`` this class states (an inherited one names another algorithm), else the registered name."""
        return vars(cls).get("title") or cls.name

    @classmethod
    def phases(cls, config: AlgorithmConfig, actor_config) -> Phases:
        """The optional phases of this run: old log-prob unless the rollout's are used, reference when β > 0."""
        recompute = cls.uses_log_probs and (cls.needs_old_log_prob_recompute or not actor_config.use_rollout_log_probs)
        return Phases(
            old_log_prob=recompute,
            reference=actor_config.kl_beta > 0,
            old_outputs=cls.old_outputs,
            old_policy_adapter=cls.old_policy_adapter,
            reference_in_update=cls.reference_in_update,
        )

    @classmethod
    def old_policy_decay(cls, config: AlgorithmConfig, optimizer_steps: int) -> float:
        """η of the old adapter's update θ_old ← η·θ_old + (1 − η)·θ after ``optimizer_steps`` optimizer steps."""
        raise NotImplementedError(f"{cls.__name__} declares no old-policy adapter")

    @classmethod
    def compute_advantage(cls, scores: torch.Tensor, index: Sequence, config: AlgorithmConfig) -> torch.Tensor:
        """Per-sample advantages ``[B]`` from rewards ``scores`` ``[B]`` and group ids ``index`` (the prompt uid)."""
        raise NotImplementedError(f"{cls.__name__} must define compute_advantage")

    @classmethod
    def arrange_update(cls, scores: torch.Tensor, index: Sequence, config: AlgorithmConfig) -> UpdateRows | None:
        """The update batch's layout from rewards ``scores`` ``[B]`` and group ids ``index``; None (the default): the
        batch as it is. A loss that couples samples (a preference pair) lays them out here so they meet."""
        return None

    @classmethod
    def build_loss(cls, actor_config, config: AlgorithmConfig) -> AlgorithmLoss:
        """The loss the actor calls (built in every actor process, and in the trainer to read its keys)."""
        return cls.loss_cls(actor_config, config)

    @classmethod
    def check(cls, configs) -> None:
        """Cross-node rules of this algorithm (``configs``: ``RunConfigs``), run before Ray starts.

        Raise ``ValueError`` naming the dotted key; the base accepts everything.
        """


def _is_algorithm_class(obj: object) -> bool:
    return inspect.isclass(obj) and issubclass(obj, Algorithm)


def _import_builtin_algorithms() -> None:
    """Import every module of this package (each built-in registers itself)."""
    import_submodules(ALGORITHMS_PACKAGE)


ALGORITHMS: Registry = Registry(
    "algorithm",
    check=_is_algorithm_class,
    discover=_import_builtin_algorithms,
    entry_point_group=ALGORITHM_ENTRY_POINT_GROUP,
    how_to_add=(
        "Add a module verl_omni/algorithms/<name>.py with an Algorithm subclass decorated "
        "@register_algorithm('<name>') and a config verl_omni/trainer/config/algorithm/<name>.yaml, or install a "
        f"package declaring an entry point in group {ALGORITHM_ENTRY_POINT_GROUP!r}: "
        "'<name> = \"<module>:<AlgorithmClass>\"' (docs/extending/algorithm.md)."
    ),
)


def register_algorithm(name: str):
    """Class decorator: register an :class:`Algorithm` subclass under ``name`` (its ``name`` attribute is set)."""
    register = ALGORITHMS.register(name)

    def decorator(cls: type[Algorithm]) -> type[Algorithm]:
        if _is_algorithm_class(cls):
            _check_declarations(cls, name)
            cls.name = name
        return register(cls)

    return decorator


def _check_declarations(cls: type[Algorithm], name: str) -> None:
    if cls.rollout_record not in ROLLOUT_RECORDS:
        raise TypeError(f"algorithm {name!r}: rollout_record={cls.rollout_record!r} must be one of {ROLLOUT_RECORDS}")
    if not (inspect.isclass(cls.loss_cls) and issubclass(cls.loss_cls, AlgorithmLoss)):
        raise TypeError(f"algorithm {name!r}: loss_cls must be an AlgorithmLoss subclass, got {cls.loss_cls!r}")
    if not (inspect.isclass(cls.config_cls) and issubclass(cls.config_cls, AlgorithmConfig)):
        raise TypeError(f"algorithm {name!r}: config_cls must be an AlgorithmConfig subclass, got {cls.config_cls!r}")


def get_algorithm(name: str) -> type[Algorithm]:
    """The algorithm registered as ``name`` (a miss lists the registered ones and how to add one)."""
    algorithm = ALGORITHMS.get(name)
    if "name" not in vars(algorithm):
        # registered by an entry point alone (no decorator; maybe a subclass of a built-in): it learns its name here
        _check_declarations(algorithm, name)
        algorithm.name = name
    return algorithm


def algorithm_config_from(node: Mapping[str, Any] | None) -> AlgorithmConfig:
    """The ``algorithm`` node (a mapping or DictConfig) as its algorithm's config dataclass; errors name the key."""
    from omegaconf import OmegaConf

    values = dict(OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else (node or {}))
    values.pop("_target_", None)
    name = values.get("name", DEFAULT_ALGORITHM)
    try:
        algorithm = get_algorithm(name)
    except ValueError as e:
        raise ValueError(f"algorithm.name: {e}") from None
    fields = set(algorithm.config_cls.__dataclass_fields__)
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ValueError(
            f"algorithm.{unknown[0]} is not a key of algorithm {name!r} ({algorithm.config_cls.__name__}); "
            f"its keys: {sorted(fields - {'_target_'})}"
        )
    try:
        return algorithm.config_cls(**values)
    except (TypeError, ValueError) as e:
        raise ValueError(f"algorithm ({name}): {e}") from e


def serves(algorithm: type[Algorithm], adapter) -> bool:
    """Whether ``adapter``'s model can serve ``algorithm``: it records what the algorithm needs and, when it names the
    algorithms it supports (``ModelAdapter.algorithms``), names this one."""
    allowed = adapter.algorithms
    return algorithm.rollout_record in tuple(adapter.rollout_records) and (allowed is None or algorithm.name in allowed)


def supported_algorithms(adapter) -> list[str]:
    """Every registered algorithm (built-in or installed) that ``adapter``'s model serves, by name."""
    return [name for name in ALGORITHMS.names() if serves(get_algorithm(name), adapter)]


def check_model_supports(algorithm: type[Algorithm], adapter, model: str = "") -> None:
    """Refuse a model whose adapter cannot serve ``algorithm``, naming both and the algorithms it serves (run before
    Ray starts, before the algorithm's own checks: a pairing that cannot run is the first thing to fix).

    The adapter states what its rollout pipeline can record (``rollout_records``) and may restrict the
    algorithms it supports by name (``algorithms``; None: every algorithm whose record it can make). The sampler
    settings it serves (``sampler_choices``) are checked with its other sampling facts (``SamplingSpec.for_model``).
    """
    if serves(algorithm, adapter):
        return
    where = f"{adapter.__name__}" + (f" (actor_rollout_ref.model.path={model})" if model else "")
    records = tuple(adapter.rollout_records)
    if algorithm.rollout_record not in records:
        why = (
            f"the algorithm needs a rollout that records {algorithm.rollout_record!r}, the model's rollout pipeline "
            f"records {list(records)}"
        )
    else:
        why = f"the model supports the algorithms {list(adapter.algorithms)} only"
    raise ValueError(
        f"algorithm={algorithm.name}: {where} cannot serve it: {why}; algorithms this model serves: "
        f"{supported_algorithms(adapter)} (choose one with algorithm=<name>, or another model)"
    )

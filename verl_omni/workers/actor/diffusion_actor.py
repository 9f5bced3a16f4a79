"""The actor's phases on a ``DiffusersFSDPEngine`` (cf. verl's ``DataParallelPPOActor``), for any algorithm.

``compute_log_prob`` (old policy, no grad), ``compute_ref_prev_sample_mean`` (the reference: the
same weights with the LoRA disabled, or full fine-tuning's frozen base copy) and ``update_policy`` (``ppo_epochs`` × mini-batches, one optimizer step
per mini-batch, gradients accumulated over micro-batches × replayed steps inside the engine).
The loss and the rollout record are the algorithm's (``algorithm=<name>``); every metric the loss
returns is reduced with the reduction it declares (``AlgorithmLoss.metric_reductions``, mean when
not declared) over steps, mini-batches and the data-parallel ranks, so every rank returns the same
numbers. With ``algorithm.drop_zero_std_groups``, or an algorithm that lays out its update rows
(``Algorithm.arrange_update``), the batch carries a ``sample_mask``: the engine trains on the kept samples only
(:mod:`~verl_omni.workers.utils.sample_mask`), and a mini-batch with no kept sample on any rank is skipped (no
optimizer step; ``actor/skipped_mini_batches``).
"""

from __future__ import annotations

import logging
import math
from contextlib import nullcontext

import torch
import torch.distributed as dist
from tensordict import TensorDict
from verl.utils.device import get_device_id

from verl_omni.algorithms import AlgorithmConfig
from verl_omni.pipelines.sampling import SamplingSpec
from verl_omni.workers.config.actor import DiffusionActorConfig
from verl_omni.workers.engine.fsdp.diffusers_impl import MICRO_BATCH_KEY, ROLLOUT_RECORD_KEY, SAMPLING_SPEC_KEY
from verl_omni.workers.utils.losses import run_algorithm
from verl_omni.workers.utils.sample_mask import SAMPLE_MASK_KEY, global_kept_count

logger = logging.getLogger(__name__)

# the actor's own metrics (the engine's, and mini-batches skipped for want of kept samples), reduced like the loss's
ENGINE_METRIC_REDUCTIONS = {"grad_norm": "mean", "skipped_mini_batches": "max"}
# what the non-tensor part of a batch carries to the engine, copied onto every mini-batch
NON_TENSOR_KEYS = (SAMPLING_SPEC_KEY, MICRO_BATCH_KEY, ROLLOUT_RECORD_KEY)


class DiffusionActor:
    """The actor's compute phases over one engine; ``data`` is a local (per-rank) TensorDict ``[B]``."""

    def __init__(self, engine, config: DiffusionActorConfig, algorithm_config: AlgorithmConfig):
        """``algorithm_config``: the run's ``algorithm`` node (required: the actor never picks an algorithm)."""
        algorithm = run_algorithm(algorithm_config, "DiffusionActor")
        self.engine = engine
        config.validate(self._shard_ranks())
        self.config = config
        self.loss_fn = algorithm.build_loss(config, algorithm_config)
        self.rollout_record = algorithm.rollout_record
        self.algorithm, self.algorithm_config = algorithm, algorithm_config
        # the old policy as an EMA adapter (the engine holds it, and counts the optimizer steps its decay reads)
        self.old_policy_adapter = algorithm.phases(algorithm_config, config).old_policy_adapter
        # the trainer sends a sample_mask and the update trains on its kept samples only
        self.drop_zero_std_groups = algorithm_config.drop_zero_std_groups
        self.metric_reductions = {**ENGINE_METRIC_REDUCTIONS, **self.loss_fn.metric_reductions}

    def _prepare(self, data: TensorDict, spec: SamplingSpec, micro_batch_size: int) -> TensorDict:
        data = data.clone(recurse=False)
        data.set_non_tensor(SAMPLING_SPEC_KEY, spec)
        data.set_non_tensor(MICRO_BATCH_KEY, micro_batch_size)
        data.set_non_tensor(ROLLOUT_RECORD_KEY, self.rollout_record)
        return data

    def infer(self, data: TensorDict, spec: SamplingSpec, reference: bool = False) -> dict[str, torch.Tensor]:
        """Replay without grad: the replay's outputs per recorded step, fp32 (an SDE window: ``log_probs``
        ``[B, W]`` and ``prev_sample_mean`` ``[B, W, N, C]``).

        With ``reference=True`` the reference policy replays (the LoRA disabled, or full fine-tuning's frozen copy).
        """
        with self.engine.eval_mode(), self.engine.reference_policy() if reference else nullcontext():
            out = self.engine.infer_batch(self._prepare(data, spec, self.config.infer_micro_batch_size))
        out.pop("metrics", None)
        return out

    def compute_log_prob(self, data: TensorDict, spec: SamplingSpec) -> torch.Tensor:
        """log π_old of every recorded transition, ``[B, W]`` fp32."""
        return self.infer(data, spec)["log_probs"]

    def compute_ref_prev_sample_mean(self, data: TensorDict, spec: SamplingSpec) -> torch.Tensor:
        """μ_ref of every recorded transition (the reference policy), ``[B, W, N, C]`` fp32."""
        return self.infer(data, spec, reference=True)["prev_sample_mean"]

    def update_policy(self, data: TensorDict, spec: SamplingSpec) -> dict[str, float]:
        """One update on ``data`` (carrying the loss's ``required_keys``); returns ``actor/*`` metrics."""
        local = self.config.mini_batch_samples // self._shard_ranks()
        size = data.batch_size[0]
        if size % local:
            raise ValueError(
                f"local batch {size} must divide by actor.ppo_mini_batch_size * rollout.n / dp = {local} samples"
            )
        if self.drop_zero_std_groups:
            self._check_sample_mask(data)
        masked = SAMPLE_MASK_KEY in data.keys()
        data = self._prepare(data, spec, self.config.ppo_micro_batch_size_per_gpu)
        lr = self.engine.optimizer.param_groups[0]["lr"]
        collected: dict[str, list[float]] = {}
        skipped = 0
        with self.engine.train_mode():
            for epoch in range(self.config.ppo_epochs):
                for mini_batch in self._mini_batches(data, local, epoch):
                    if masked and not self._kept_anywhere(mini_batch):
                        skipped += 1
                        continue
                    out = self.engine.train_batch(mini_batch, self.loss_fn)
                    metrics = dict(out["metrics"])
                    if epoch > 0:
                        for key in self.loss_fn.first_epoch_metrics:
                            metrics.pop(key, None)
                    for key, values in metrics.items():
                        collected.setdefault(key, []).extend(values if isinstance(values, list) else [values])
            decay = self._update_old_policy() if self.old_policy_adapter else None
        if masked:
            collected["skipped_mini_batches"] = [float(skipped)]
        self.engine.lr_scheduler_step()
        reduced = _reduce_over_ranks(collected, self.metric_reductions)
        reduced["lr"] = lr
        if decay is not None:
            reduced["old_policy_decay"] = decay
        return {f"actor/{key}": value for key, value in reduced.items()}

    def _check_sample_mask(self, data: TensorDict) -> None:
        """The trainer's mask is there and keeps a sample somewhere (it skips the update of a step that keeps none)."""
        if SAMPLE_MASK_KEY not in data.keys():
            raise KeyError(
                f"algorithm.drop_zero_std_groups=true: the update batch lacks {SAMPLE_MASK_KEY!r} (the trainer's "
                "adv phase sets it)"
            )
        if global_kept_count(data[SAMPLE_MASK_KEY]) == 0:
            raise ValueError(
                f"algorithm.drop_zero_std_groups=true: {SAMPLE_MASK_KEY} keeps no sample on any rank; the trainer "
                "skips the update of such a step instead of calling it"
            )

    def _kept_anywhere(self, mini_batch: TensorDict) -> bool:
        return global_kept_count(mini_batch[SAMPLE_MASK_KEY]) > 0

    def _shard_ranks(self) -> int:
        """Ranks that each hold a share of a batch: every rank, the worker splitting a batch over all of them (the
        ranks of a sequence-parallel group pool their shares inside the engine, which counts data-parallel groups)."""
        return self.engine.get_data_parallel_size() * self.engine.ulysses_sequence_parallel_size

    def _update_old_policy(self) -> float:
        """The old-policy adapter's soft update after this update's optimizer steps; returns its decay."""
        decay = self.algorithm.old_policy_decay(self.algorithm_config, self.engine.optimizer_steps)
        self.engine.update_old_adapter(decay)
        return decay

    def _mini_batches(self, data: TensorDict, local: int, epoch: int):
        size = data.batch_size[0]
        if self.config.shuffle:
            order = torch.randperm(size, generator=torch.Generator().manual_seed(self.config.seed + epoch))
        else:
            order = torch.arange(size)
        for start in range(0, size, local):
            mini_batch = data[order[start : start + local]]
            for key in NON_TENSOR_KEYS:
                mini_batch.set_non_tensor(key, data.get_non_tensor(key))
            yield mini_batch


def _reduce_over_ranks(collected: dict[str, list[float]], reductions: dict[str, str]) -> dict[str, float]:
    """Each metric's values of every rank reduced as ``reductions`` declares (mean when it does not).

    A rank may lack a metric another reports (with a ``sample_mask``, a rank whose micro-batches kept no
    sample reports no loss metric): the names are gathered first and the collectives run over their union.
    """
    keys = set(collected)
    if dist.is_initialized():
        names: list = [None] * dist.get_world_size()
        dist.all_gather_object(names, sorted(keys))
        keys = set().union(*names)
    keys = sorted(keys)
    device = get_device_id()
    values = [collected.get(k, []) for k in keys]
    sums = torch.tensor([sum(v) for v in values], dtype=torch.float64, device=device)
    counts = torch.tensor([len(v) for v in values], dtype=torch.float64, device=device)
    maxes = torch.tensor([max(v, default=-math.inf) for v in values], dtype=torch.float64, device=device)
    mins = torch.tensor([min(v, default=math.inf) for v in values], dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(sums)
        dist.all_reduce(counts)
        dist.all_reduce(maxes, op=dist.ReduceOp.MAX)
        dist.all_reduce(mins, op=dist.ReduceOp.MIN)
    by_reduction = {"mean": sums / counts, "sum": sums, "max": maxes, "min": mins}
    return {k: float(by_reduction[reductions.get(k, "mean")][i]) for i, k in enumerate(keys)}

"""Flow-GRPO phases on a ``DiffusersFSDPEngine`` (cf. verl's ``DataParallelPPOActor``).

``compute_log_prob`` (old policy, no grad), ``compute_ref_prev_sample_mean`` (the same weights
with the LoRA disabled) and ``update_policy`` (``ppo_epochs`` × mini-batches, one optimizer step
per mini-batch, gradients accumulated over micro-batches × replayed steps inside the engine).
Metrics are reduced over the data-parallel ranks, so every rank returns the same numbers.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext

import torch
import torch.distributed as dist
from tensordict import TensorDict
from verl.utils.device import get_device_id

from verl_omni.pipelines.sampling import SamplingSpec
from verl_omni.workers.config.actor import DiffusionActorConfig
from verl_omni.workers.engine.fsdp.diffusers_impl import MICRO_BATCH_KEY, SAMPLING_SPEC_KEY
from verl_omni.workers.utils.losses import make_policy_loss

logger = logging.getLogger(__name__)

# metric -> how it is reduced over steps, mini-batches and ranks
MEAN_METRICS = ("pg_loss", "kl_loss", "pg_clipfrac", "ppo_kl", "ratio_mean", "grad_norm")
MAX_METRICS = ("ratio_max_abs_dev", "logprob_diff_max")


class DiffusionActor:
    """The actor's compute phases over one engine; ``data`` is a local (per-rank) TensorDict ``[B]``."""

    def __init__(self, engine, config: DiffusionActorConfig):
        config.validate(engine.get_data_parallel_size())
        self.engine = engine
        self.config = config
        self.loss_fn = make_policy_loss(config)

    def _prepare(self, data: TensorDict, spec: SamplingSpec) -> TensorDict:
        data = data.clone(recurse=False)
        data.set_non_tensor(SAMPLING_SPEC_KEY, spec)
        data.set_non_tensor(MICRO_BATCH_KEY, self.config.ppo_micro_batch_size_per_gpu)
        return data

    def infer(self, data: TensorDict, spec: SamplingSpec, reference: bool = False) -> dict[str, torch.Tensor]:
        """Replay without grad: ``log_probs`` ``[B, W]`` and ``prev_sample_mean`` ``[B, W, N, C]`` (fp32).

        With ``reference=True`` the LoRA is disabled: the base model, i.e. the reference policy.
        """
        with self.engine.eval_mode(), self.engine.disable_adapter() if reference else nullcontext():
            out = self.engine.infer_batch(self._prepare(data, spec))
        return {"log_probs": out["log_probs"], "prev_sample_mean": out["prev_sample_mean"]}

    def compute_log_prob(self, data: TensorDict, spec: SamplingSpec) -> torch.Tensor:
        """log π_old of every recorded transition, ``[B, W]`` fp32."""
        return self.infer(data, spec)["log_probs"]

    def compute_ref_prev_sample_mean(self, data: TensorDict, spec: SamplingSpec) -> torch.Tensor:
        """μ_ref of every recorded transition (LoRA disabled), ``[B, W, N, C]`` fp32."""
        return self.infer(data, spec, reference=True)["prev_sample_mean"]

    def update_policy(self, data: TensorDict, spec: SamplingSpec) -> dict[str, float]:
        """One Flow-GRPO update on ``data`` (log π_old under ``config.old_log_prob_key``, ``advantages``);
        returns ``actor/*`` metrics."""
        local = self.config.ppo_mini_batch_size // self.engine.get_data_parallel_size()
        size = data.batch_size[0]
        if size % local:
            raise ValueError(f"local batch {size} must divide by actor.ppo_mini_batch_size / dp = {local}")
        data = self._prepare(data, spec)
        lr = self.engine.optimizer.param_groups[0]["lr"]
        collected: dict[str, list[float]] = {}
        with self.engine.train_mode():
            for epoch in range(self.config.ppo_epochs):
                for mini_batch in self._mini_batches(data, local, epoch):
                    out = self.engine.train_batch(mini_batch, self.loss_fn)
                    metrics = dict(out["metrics"])
                    if epoch > 0:
                        metrics.pop("logprob_diff_max", None)
                    for key, values in metrics.items():
                        collected.setdefault(key, []).extend(values if isinstance(values, list) else [values])
        self.engine.lr_scheduler_step()
        reduced = _reduce_over_ranks(collected)
        reduced["lr"] = lr
        return {f"actor/{key}": value for key, value in reduced.items()}

    def _mini_batches(self, data: TensorDict, local: int, epoch: int):
        size = data.batch_size[0]
        if self.config.shuffle:
            order = torch.randperm(size, generator=torch.Generator().manual_seed(self.config.seed + epoch))
        else:
            order = torch.arange(size)
        for start in range(0, size, local):
            mini_batch = data[order[start : start + local]]
            mini_batch.set_non_tensor(SAMPLING_SPEC_KEY, data.get_non_tensor(SAMPLING_SPEC_KEY))
            mini_batch.set_non_tensor(MICRO_BATCH_KEY, data.get_non_tensor(MICRO_BATCH_KEY))
            yield mini_batch


def _reduce_over_ranks(collected: dict[str, list[float]]) -> dict[str, float]:
    """Mean or max over every value of every rank (all ranks must have the same keys)."""
    keys = sorted(collected)
    unknown = [k for k in keys if k not in MEAN_METRICS + MAX_METRICS]
    if unknown:
        raise KeyError(f"no reduction declared for metrics {unknown}; add them to MEAN_METRICS or MAX_METRICS")
    device = get_device_id()
    sums = torch.tensor([sum(collected[k]) for k in keys], dtype=torch.float64, device=device)
    counts = torch.tensor([len(collected[k]) for k in keys], dtype=torch.float64, device=device)
    maxes = torch.tensor([max(collected[k]) for k in keys], dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(sums)
        dist.all_reduce(counts)
        dist.all_reduce(maxes, op=dist.ReduceOp.MAX)
    return {k: float(maxes[i] if k in MAX_METRICS else sums[i] / counts[i]) for i, k in enumerate(keys)}

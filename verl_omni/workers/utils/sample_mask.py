"""Leaving samples out of an update (``algorithm.drop_zero_std_groups``): a per-sample mask, not fewer rows.

The trainer marks the samples that enter the update with a boolean ``sample_mask`` ``[B]`` (False for
the prompt groups whose rewards are all equal). The rows stay in the batch, and the engine still
replays every row of every micro-batch; only the loss sees the kept rows, and the loss's weight counts
only them:

* verl splits a batch evenly over the data-parallel ranks and each rank into equal mini- and
  micro-batches (``ppo_mini_batch_size`` must divide); dropping rows would break those divisions (the
  Flow-GRPO authors pad their filtered batch back with dropped samples for this), and ranks left with
  different numbers of micro-batches would run different numbers of FSDP collectives and hang;
* with the rows kept, every rank runs the same forwards and backwards. A micro-batch without a kept
  row back-propagates a zero that is still connected to the replay's graph, so its FSDP gathers match
  the other ranks'.

Normalization: the loss of a micro-batch is the algorithm's loss over its kept rows (a mean over them),
weighted ``k·dp / (K·S)`` for k kept rows in it, K kept rows in the whole mini-batch over all dp ranks
and S replayed steps; FSDP averages the ranks' gradients, so the update's gradient is that of the mean
over the K kept samples × S steps: what an update on the kept samples alone would give. Without a
mask the weight is ``b / (B·S)`` (the mean over all B local samples), today's update.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

# per-sample bool [B]: True for the samples the update trains on (the trainer sets it with drop_zero_std_groups)
SAMPLE_MASK_KEY = "sample_mask"


def global_kept_count(mask: torch.Tensor, group=None) -> int:
    """Kept samples of ``mask`` summed over the ranks of ``group`` (this rank's when not distributed)."""
    from verl.utils.device import get_device_id

    count = torch.tensor([int(mask.sum())], dtype=torch.int64, device=get_device_id())
    if dist.is_initialized():
        dist.all_reduce(count, group=group)
    return int(count.item())


def select_rows(replayed, rows: torch.Tensor):
    """The rows ``rows`` of a replayed step: a NamedTuple whose tensor fields are batch-first (None stays None)."""
    if not hasattr(replayed, "_fields"):
        raise TypeError(f"a replayed step must be a NamedTuple of batch-first tensors, got {type(replayed).__name__}")
    size = next(v.shape[0] for v in replayed if isinstance(v, torch.Tensor))
    values = {}
    for name, value in zip(replayed._fields, replayed, strict=True):
        if isinstance(value, torch.Tensor) and (value.ndim == 0 or value.shape[0] != size):
            raise ValueError(
                f"{type(replayed).__name__}.{name} has shape {tuple(value.shape)}; every field of a replayed step "
                f"must be batch-first [{size}, ...] for the sample mask to select rows"
            )
        values[name] = value[rows] if isinstance(value, torch.Tensor) else value
    return type(replayed)(**values)


def masked_step_loss(
    loss_function: Callable, replayed, micro_batch, step: int, keep: torch.Tensor
) -> tuple[torch.Tensor, dict[str, float]]:
    """The algorithm's loss of one replayed step over the kept rows of a micro-batch (``keep`` ``[b]`` bool).

    Returns ``(loss, metrics)``; with no kept row, a zero connected to the replay's graph (so that the
    backward runs the same FSDP collectives as on the other ranks) and no metrics.
    """
    rows = torch.nonzero(keep.to(torch.bool), as_tuple=False).flatten()
    if len(rows) == 0:
        grads = [v.sum() for v in replayed if isinstance(v, torch.Tensor) and v.requires_grad]
        if not grads:
            raise RuntimeError(f"{type(replayed).__name__} carries no tensor with gradients to back-propagate")
        return 0.0 * torch.stack(grads).sum(), {}
    return loss_function(select_rows(replayed, rows), micro_batch[rows], step)


def step_loss_weight(kept: int, kept_global: int, dp_size: int, num_steps: int) -> float:
    """``k·dp / (K·S)``: the weight of a micro-batch's masked loss (module docstring); ``K`` must be > 0."""
    if kept_global <= 0:
        raise ValueError(
            f"no sample of this mini-batch is kept on any rank ({SAMPLE_MASK_KEY} all False): the actor skips "
            "such mini-batches"
        )
    return kept * dp_size / (kept_global * num_steps)

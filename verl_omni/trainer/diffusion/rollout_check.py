"""How far the actor's log-probs are from the rollout's, for the loss that divides by the rollout's.

With ``actor.use_rollout_log_probs`` the loss takes log π_old from the rollout's record, so the actor's replay of the
batch (``actor.rollout_log_prob_check_freq``) only checks that the two still compute one policy: a stale replica, a
dtype or kernel change shows as a gap beyond numerics. A check needs no more than a few rows of each prompt group
(``actor.rollout_log_prob_check_per_prompt``): a group's rows were sampled by one replica, so a row of every group
covers every replica that served the step, at a fraction of the full replay's cost.
"""

from __future__ import annotations

import logging
from collections import Counter

import numpy as np
import torch
from verl import DataProto
from verl.protocol import pad_dataproto_to_divisor

from verl_omni.workers.config.actor import DiffusionActorConfig

logger = logging.getLogger(__name__)

# the metric the check logs, and the warning's subject
GAP_METRIC = "old_log_prob/rollout_diff_max"
CHECK_ROWS_METRIC = "old_log_prob/check_rows"


def check_rows(uids: np.ndarray, per_prompt: int) -> np.ndarray:
    """Indices of the first ``per_prompt`` rows of each prompt group (rows sharing a ``uid``), in batch order; every
    row for 0."""
    if per_prompt == 0:
        return np.arange(len(uids))
    taken: Counter = Counter()
    rows = []
    for row, uid in enumerate(uids):
        if taken[uid] < per_prompt:
            taken[uid] += 1
            rows.append(row)
    return np.asarray(rows, dtype=np.int64)


def check_request(actor_input: DataProto, rows: np.ndarray, ranks: int) -> tuple[DataProto, int]:
    """The actor's input for the check: ``rows`` of ``actor_input`` (which names no old outputs, so the replay
    returns log-probs only), its first rows repeated up to a multiple of ``ranks`` (the worker group splits a batch
    evenly); and the number repeated, whose outputs :func:`verl.protocol.unpad_dataproto` drops."""
    return pad_dataproto_to_divisor(actor_input.select_idxs(rows), ranks)


def rollout_gap(
    actor_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, actor: DiffusionActorConfig, step: int
) -> float:
    """The largest |log π_actor − log π_rollout| over the rows given; warns when the loss divides by the rollout's
    log-probs and the gap is more than its ratio takes as numerics (``actor.rollout_gap_limit``)."""
    gap = (actor_log_probs - rollout_log_probs).abs().max().item()
    if actor.use_rollout_log_probs and gap > actor.rollout_gap_limit:
        limit = (
            "log actor.rollout_correction.rollout_is_threshold" if actor.rollout_is_truncated else "actor.clip_ratio"
        )
        logger.warning(
            "step %d: the actor's log-probs are %.3g from the rollout's, more than %s (%g): the loss divides "
            "by the rollout's (actor.use_rollout_log_probs=true), so numerics alone move its ratio that far; "
            "check the rollout's weights and dtype, or set actor.use_rollout_log_probs=false",
            step,
            gap,
            limit,
            actor.rollout_gap_limit,
        )
    return gap

"""``trainer.nan_policy``: a NaN or Inf reward, advantage, loss or gradient norm is not trained on.

The driver checks the step's numbers where they are made: the rewards after the ``reward`` phase
and the advantages after ``adv`` (before the actor is sent anything to update with), the loss and
the gradient norm the actor's ranks report after ``update_actor`` (their optimizer already skips a
mini-batch whose global gradient norm is not finite, the same on every rank, since the norm is
reduced over them). ``stop`` (default) raises :class:`NonFiniteError` naming the step and the
source, before the step's checkpoint: the newest complete checkpoint stays the last good one.
``skip_step`` drops the step's update (no ``update_actor`` call when the rewards or advantages are
bad), logs it and counts it in ``training/non_finite_steps_skipped``.
"""

from __future__ import annotations

import math

import torch

NAN_POLICIES = ("stop", "skip_step")
# the actor's metrics that must be finite after an update (reduced over the ranks, so equal on every rank)
UPDATE_METRICS = ("actor/pg_loss", "actor/grad_norm")


class NonFiniteError(RuntimeError):
    """A step produced a NaN or Inf where training would use it; the message names the step, source and fix."""


def bad_rows(values: torch.Tensor) -> list[int]:
    """Indices of the rows of ``values`` (any shape, first dim = samples) holding a NaN or an Inf."""
    finite = torch.isfinite(values.float().reshape(len(values), -1)).all(dim=1)
    return (~finite).nonzero().flatten().tolist()


def describe_rows(name: str, values: torch.Tensor, uids, rows: list[int], source: str) -> str:
    """``<name> of sample(s) i (prompt uid u: value), ... from <source>``, at most 8 samples listed."""
    shown = [f"{i} (prompt {uids[i]}: {values[i].flatten()[0].item()})" for i in rows[:8]]
    more = f" and {len(rows) - 8} more" if len(rows) > 8 else ""
    return f"{name} of sample(s) {', '.join(shown)}{more} from {source} not finite"


def bad_update_metrics(metrics: dict) -> dict[str, float]:
    """The actor's update metrics that are NaN or Inf."""
    return {k: metrics[k] for k in UPDATE_METRICS if k in metrics and not math.isfinite(metrics[k])}


def error(step: int, what: str, policy_key: str = "trainer.nan_policy") -> NonFiniteError:
    return NonFiniteError(
        f"step {step}: {what}; stopped before its checkpoint (the newest complete one is the last good step). "
        f"Fix the source, or set {policy_key}=skip_step to drop such steps' updates and go on"
    )

"""The sample mask of ``algorithm.drop_zero_std_groups`` on pure tensors: the masked loss and its weights give the
gradient of the mean over the kept samples only; no kept sample gives a zero gradient, not NaN."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from verl_omni.algorithms.flow_grpo import FlowGRPOAlgoConfig, FlowGRPOLoss
from verl_omni.workers.config.actor import DiffusionActorConfig
from verl_omni.workers.utils.replay import ReplayedSDEStep
from verl_omni.workers.utils.sample_mask import masked_step_loss, select_rows, step_loss_weight

B, W, N, C = 6, 2, 3, 2
# per-sample advantages: rows 2 and 3 would push hard if they were not left out
ADVANTAGES = torch.tensor([1.0, -0.5, 4.0, -4.0, 0.25, -1.5])
KEEP = torch.tensor([True, True, False, False, True, True])


def _replayed(log_prob: torch.Tensor) -> ReplayedSDEStep:
    mean = torch.zeros(len(log_prob), N, C)
    return ReplayedSDEStep(mean, log_prob, mean, torch.ones(len(log_prob), 1, 1), -torch.ones(len(log_prob)) / 4)


def _batch(keep: torch.Tensor) -> TensorDict:
    old = torch.linspace(-0.3, 0.2, B * W).reshape(B, W)
    return TensorDict({"old_log_probs": old, "advantages": ADVANTAGES, "sample_mask": keep}, batch_size=[B])


def _loss() -> FlowGRPOLoss:
    return FlowGRPOLoss(DiffusionActorConfig(clip_ratio=10.0), FlowGRPOAlgoConfig())


def _accumulated_grad(batch: TensorDict, log_prob: torch.Tensor, micro: int, masked: bool, step: int = 0):
    """The engine's accumulation over micro-batches of one step (S = 1, one rank): gradient on ``log_prob``."""
    leaf = log_prob.clone().requires_grad_(True)
    replayed, loss_fn, metrics = _replayed(leaf), _loss(), []
    kept_global = int(batch["sample_mask"].sum())
    for start in range(0, B, micro):
        rows = torch.arange(start, min(start + micro, B))
        part, micro_batch = select_rows(replayed, rows), batch[rows]
        if masked:
            keep = micro_batch["sample_mask"]
            loss, m = masked_step_loss(loss_fn, part, micro_batch, step, keep)
            weight = step_loss_weight(int(keep.sum()), kept_global, dp_size=1, num_steps=1)
        else:
            loss, m = loss_fn(part, micro_batch, step)
            weight = len(rows) / B
        (loss * weight).backward()
        metrics.append(m)
    return leaf.grad, metrics


@pytest.mark.parametrize("micro", [1, 2, 3, 6])
def test_masked_update_is_the_mean_over_the_kept_samples_only(micro):
    log_prob = torch.linspace(-0.25, 0.3, B)
    batch = _batch(KEEP)
    grad, _ = _accumulated_grad(batch, log_prob, micro, masked=True)
    # by hand: the ratio's gradient is rho; the loss is mean over the 4 kept samples of -A*rho (no clipping)
    rho = torch.exp(log_prob - batch["old_log_probs"][:, 0])
    want = torch.where(KEEP, -ADVANTAGES * rho / int(KEEP.sum()), torch.zeros(B))
    torch.testing.assert_close(grad, want)
    assert torch.equal(grad[~KEEP], torch.zeros(int((~KEEP).sum())))


@pytest.mark.parametrize("micro", [2, 3])
def test_without_a_mask_the_update_is_the_mean_over_all_samples(micro):
    log_prob = torch.linspace(-0.25, 0.3, B)
    batch = _batch(KEEP)
    grad, _ = _accumulated_grad(batch, log_prob, micro, masked=False)
    rho = torch.exp(log_prob - batch["old_log_probs"][:, 0])
    torch.testing.assert_close(grad, -ADVANTAGES * rho / B)
    # a mask keeping every sample gives the same update
    torch.testing.assert_close(
        _accumulated_grad(_batch(torch.ones(B, dtype=torch.bool)), log_prob, micro, True)[0], grad
    )


def test_a_micro_batch_without_kept_samples_back_propagates_zero_and_reports_no_metrics():
    log_prob = torch.linspace(-0.25, 0.3, B)
    grad, metrics = _accumulated_grad(_batch(KEEP), log_prob, micro=2, masked=True)
    assert metrics[1] == {} and metrics[0] and metrics[2]
    assert bool(torch.isfinite(grad).all())
    # the zero is connected to the replay's graph: the backward reaches the (here unused) leaf
    leaf = torch.zeros(2, requires_grad=True)
    loss, metrics = masked_step_loss(_loss(), _replayed(leaf), _batch(KEEP)[2:4], 0, KEEP[2:4])
    assert loss.item() == 0.0 and metrics == {}
    loss.backward()
    assert torch.equal(leaf.grad, torch.zeros(2))


def test_a_mini_batch_with_nothing_kept_anywhere_is_refused_not_divided_by_zero():
    with pytest.raises(ValueError, match="sample_mask all False"):
        step_loss_weight(0, 0, dp_size=2, num_steps=3)
    # two ranks, 3 steps: k*dp/(K*S)
    assert step_loss_weight(1, 4, dp_size=2, num_steps=3) == pytest.approx(2 / 12)


def test_select_rows_needs_batch_first_fields():
    step = _replayed(torch.zeros(4))
    picked = select_rows(step, torch.tensor([1, 3]))
    assert picked.prev_sample_mean.shape == (2, N, C) and picked.dt.shape == (2,)
    with pytest.raises(ValueError, match="dt has shape"):
        select_rows(step._replace(dt=torch.tensor(-0.25)), torch.tensor([0]))
    with pytest.raises(TypeError, match="NamedTuple"):
        select_rows({"log_prob": torch.zeros(4)}, torch.tensor([0]))

"""The actor runs any registered algorithm's loss and forwards its metrics with their declared reductions."""

from __future__ import annotations

import pytest
import torch
from actor_helpers import batch_of as _batch
from actor_helpers import build_actor as _actor

from verl_omni.algorithms.base import ALGORITHMS
from verl_omni.algorithms.flow_grpo import FlowGRPO, FlowGRPOAlgoConfig, FlowGRPOLoss

pytestmark = pytest.mark.slow


class _NewMetricsLoss(FlowGRPOLoss):
    """Flow-GRPO's loss plus metrics the actor has never heard of (one undeclared: averaged)."""

    metric_reductions = {**FlowGRPOLoss.metric_reductions, "calls": "sum", "step_index_max": "max", "adv_min": "min"}

    def __call__(self, replayed, micro_batch, step):
        loss, metrics = super().__call__(replayed, micro_batch, step)
        adv = micro_batch["advantages"]
        metrics.update(calls=1.0, step_index_max=float(step), adv_min=adv.min().item(), undeclared=2.0 * step)
        return loss, metrics


class _NewMetricsAlgorithm(FlowGRPO):
    loss_cls = _NewMetricsLoss


@pytest.fixture
def new_metrics_algorithm(monkeypatch):
    """``test_new_metrics`` registered for one test only: other modules list the registered algorithms."""
    monkeypatch.setitem(ALGORITHMS._entries, "test_new_metrics", _NewMetricsAlgorithm)


def test_a_loss_with_new_metrics_goes_through_the_actor_unchanged(
    new_metrics_algorithm, process_group, tiny_qwen_image_path, recorded_qwen_image_batch
):
    from verl_omni.pipelines.sampling import SamplingSpec

    rec = recorded_qwen_image_batch[1]
    config = FlowGRPOAlgoConfig(name="test_new_metrics")
    actor = _actor(tiny_qwen_image_path, ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=1, algorithm_config=config)
    batch = _batch(rec, torch.tensor([1.0, -1.0, 0.5, -3.0]))
    batch["old_log_probs"] = rec["rollout_log_probs"]
    metrics = actor.update_policy(batch, SamplingSpec(**rec["spec"]))
    steps = rec["all_timesteps"].shape[1]
    # 4 samples, 1 per micro-batch, W steps each: one call per (micro-batch, step)
    assert metrics["actor/calls"] == 4 * steps
    assert metrics["actor/step_index_max"] == steps - 1
    assert metrics["actor/adv_min"] == -3.0
    assert metrics["actor/undeclared"] == pytest.approx(2.0 * sum(range(steps)) / steps)
    assert {"actor/pg_loss", "actor/grad_norm", "actor/lr"} <= set(metrics)


def test_grpo_guard_update_starts_on_policy_and_reports_its_metrics(
    process_group, tiny_qwen_image_path, recorded_qwen_image_batch
):
    from verl_omni.algorithms.grpo_guard import GRPOGuardConfig
    from verl_omni.pipelines.sampling import SamplingSpec

    rec = recorded_qwen_image_batch[1]
    spec = SamplingSpec(**rec["spec"])
    actor = _actor(tiny_qwen_image_path, ppo_mini_batch_size=4, algorithm_config=GRPOGuardConfig())
    batch = _batch(rec, torch.tensor([1.0, -1.0, 1.0, -1.0]))
    old = actor.infer(batch, spec)
    batch["old_log_probs"], batch["old_prev_sample_mean"] = old["log_probs"], old["prev_sample_mean"]
    metrics = actor.update_policy(batch, spec)
    # one mini-batch: replayed before any optimizer step, the policy is the old one (ratio 1, no mean shift)
    assert metrics["actor/ratio_mean_bias"] < 1e-8
    assert metrics["actor/ratio_max_abs_dev"] < 1e-5
    assert metrics["actor/step_weight_mean"] > 1  # 1/(-dt) with |dt| < 1
    after = actor.infer(batch, spec)
    assert not torch.equal(after["prev_sample_mean"], old["prev_sample_mean"])  # the update moved the policy

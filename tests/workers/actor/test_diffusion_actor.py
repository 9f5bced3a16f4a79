"""Actor phases on a one-rank engine (gloo, in this process): KL to the reference, epochs × mini-batches."""

from __future__ import annotations

import pytest
import torch
from actor_helpers import batch_of as _batch
from actor_helpers import build_actor as _actor

pytestmark = pytest.mark.slow


def test_kl_term_pulls_the_policy_back_to_the_reference(process_group, tiny_qwen_image_path, recorded_qwen_image_batch):
    from verl_omni.pipelines.sampling import SamplingSpec

    rec = recorded_qwen_image_batch[1]
    spec = SamplingSpec(**rec["spec"])
    # random lora_B: the policy starts away from the base model; zero advantages leave only the KL term
    actor = _actor(tiny_qwen_image_path, lora_init=False, ppo_mini_batch_size=4, kl_beta=1.0)
    batch = _batch(rec, torch.zeros(4))
    batch["ref_prev_sample_mean"] = actor.compute_ref_prev_sample_mean(batch, spec)
    torch.testing.assert_close(batch["ref_prev_sample_mean"], rec["base_prev_sample_mean"], rtol=0, atol=1e-5)
    kl = []
    for _ in range(2):
        batch["old_log_probs"] = actor.compute_log_prob(batch, spec)
        kl.append(actor.update_policy(batch, spec)["actor/kl_loss"])
    assert 0 < kl[1] < kl[0]


def test_kl_without_reference_means_names_the_missing_field(
    process_group, tiny_qwen_image_path, recorded_qwen_image_batch
):
    from verl_omni.pipelines.sampling import SamplingSpec

    rec = recorded_qwen_image_batch[1]
    actor = _actor(tiny_qwen_image_path, ppo_mini_batch_size=4, kl_beta=0.1)
    batch = _batch(rec, torch.ones(4))
    batch["old_log_probs"] = rec["rollout_log_probs"]
    with pytest.raises(KeyError, match="ref_prev_sample_mean"):
        actor.update_policy(batch, SamplingSpec(**rec["spec"]))


def test_forward_only_phases_use_their_own_micro_batch(process_group, tiny_qwen_image_path, recorded_qwen_image_batch):
    """``infer_micro_batch_size_per_gpu``: the same log-probs in fewer, larger transformer calls (CFG's two passes
    are one call: 4 samples x W=2 steps are 8 calls at micro-batch 1, 2 at micro-batch 4)."""
    from verl_omni.pipelines.sampling import SamplingSpec

    rec = recorded_qwen_image_batch[1]
    spec = SamplingSpec(**rec["spec"])
    batch = _batch(rec, torch.ones(4))
    calls, log_probs = {}, {}
    for infer in (0, 4):
        actor = _actor(tiny_qwen_image_path, ppo_mini_batch_size=4, infer_micro_batch_size_per_gpu=infer)
        calls[infer] = []
        hook = actor.engine.module.register_forward_hook(
            lambda m, args, kwargs, out, rows=calls[infer]: rows.append(len(kwargs["hidden_states"])), with_kwargs=True
        )
        log_probs[infer] = actor.compute_log_prob(batch, spec)
        hook.remove()
    assert calls == {0: [2] * 8, 4: [8] * 2}
    torch.testing.assert_close(log_probs[4], log_probs[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(log_probs[4], rec["rollout_log_probs"], rtol=0, atol=1e-5)


def test_epochs_times_mini_batches_optimizer_steps(process_group, tiny_qwen_image_path, recorded_qwen_image_batch):
    from verl_omni.pipelines.sampling import SamplingSpec

    rec = recorded_qwen_image_batch[1]
    actor = _actor(tiny_qwen_image_path, ppo_mini_batch_size=2, ppo_epochs=2, shuffle=True)
    batch = _batch(rec, torch.tensor([1.0, -1.0, 1.0, -1.0]))
    batch["old_log_probs"] = rec["rollout_log_probs"]
    metrics = actor.update_policy(batch, SamplingSpec(**rec["spec"]))
    steps = {int(state["step"]) for state in actor.engine.optimizer.state.values()}
    assert steps == {4}  # 2 epochs x 2 mini-batches of 2 samples
    # the second mini-batch of epoch 0 is replayed after one step: its log-probs have moved
    assert metrics["actor/logprob_diff_max"] > 0
    assert metrics["actor/ratio_max_abs_dev"] > 0


def test_bf16_base_keeps_fp32_lora_master_weights(process_group, tiny_qwen_image_path, recorded_qwen_image_batch):
    """``engine.model_dtype=bf16`` halves the frozen base; the trained adapter must stay fp32 (an lr-1e-4
    step on a bf16 weight of size ~1 rounds to nothing)."""
    from verl_omni.pipelines.sampling import SamplingSpec

    rec = recorded_qwen_image_batch[1]
    actor = _actor(tiny_qwen_image_path, engine_kwargs={"model_dtype": "bf16"}, ppo_mini_batch_size=4)
    params = dict(actor.engine.module.named_parameters())
    lora = {n: p for n, p in params.items() if "lora_" in n}
    base = [p for n, p in params.items() if "lora_" not in n]
    assert lora and all(p.dtype == torch.float32 for p in lora.values())
    assert base and all(p.dtype == torch.bfloat16 for p in base)
    before = {n: p.detach().full_tensor().clone() for n, p in lora.items() if "lora_B" in n}
    batch = _batch(rec, torch.tensor([1.0, -1.0, 1.0, -1.0]))
    spec = SamplingSpec(**rec["spec"])
    batch["old_log_probs"] = actor.compute_log_prob(batch, spec)
    actor.update_policy(batch, spec)
    assert any(not torch.equal(before[n], lora[n].detach().full_tensor()) for n in before)


def _gradient(actor, batch, spec) -> dict[str, torch.Tensor]:
    """The LoRA's accumulated gradient of one mini-batch (the engine's forward/backward, no optimizer step)."""
    engine = actor.engine
    engine.optimizer_zero_grad()
    # the train mode zeroes the gradients on exit: read them inside
    with engine.train_mode():
        engine.forward_backward_batch(
            actor._prepare(batch, spec, actor.config.ppo_micro_batch_size_per_gpu), actor.loss_fn
        )
        params = engine.module.named_parameters()
        return {n: p.grad.full_tensor().clone() for n, p in params if p.grad is not None}


def test_sample_mask_trains_on_the_kept_samples_as_if_the_others_were_not_there(
    process_group, tiny_qwen_image_path, recorded_qwen_image_batch
):
    """``algorithm.drop_zero_std_groups``' mask on the real engine: the gradient of a masked mini-batch equals
    the gradient of the kept rows alone, and a mask keeping every row changes nothing."""
    from verl_omni.pipelines.sampling import SamplingSpec

    rec = recorded_qwen_image_batch[1]
    spec = SamplingSpec(**rec["spec"])
    # random lora_B: both LoRA factors get gradients
    actor = _actor(tiny_qwen_image_path, lora_init=False, ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2)
    batch = _batch(rec, torch.tensor([1.0, -1.0, 0.5, -2.0]))
    batch["old_log_probs"] = rec["rollout_log_probs"]
    # rows 1 and 3 left out: one kept row in each micro-batch, so the weights across micro-batches matter
    keep = torch.tensor([True, False, True, False])
    kept_alone = _gradient(actor, batch[torch.tensor([0, 2])], spec)
    masked = _gradient(actor, batch.clone().set("sample_mask", keep), spec)
    every = _gradient(actor, batch, spec)
    every_masked = _gradient(actor, batch.clone().set("sample_mask", torch.ones(4, dtype=torch.bool)), spec)
    assert kept_alone and set(masked) == set(kept_alone)
    for name, grad in kept_alone.items():
        torch.testing.assert_close(masked[name], grad, rtol=1e-4, atol=1e-7)
        torch.testing.assert_close(every_masked[name], every[name], rtol=1e-5, atol=1e-8)
    # the left-out rows had advantages of their own: without the mask the gradient differs
    assert any(not torch.allclose(every[n], kept_alone[n], rtol=1e-3, atol=1e-6) for n in kept_alone)


def test_drop_zero_std_groups_skips_empty_mini_batches_and_refuses_a_batch_that_keeps_nothing(
    process_group, tiny_qwen_image_path, recorded_qwen_image_batch
):
    from verl_omni.algorithms.flow_grpo import FlowGRPOAlgoConfig
    from verl_omni.pipelines.sampling import SamplingSpec

    rec = recorded_qwen_image_batch[1]
    spec = SamplingSpec(**rec["spec"])
    algorithm = FlowGRPOAlgoConfig(drop_zero_std_groups=True)
    actor = _actor(tiny_qwen_image_path, algorithm_config=algorithm, ppo_mini_batch_size=2, shuffle=False)
    # the kept group's advantages do not cancel: on policy (ratio 1) its pg_loss is their mean, -0.25, not 0
    batch = _batch(rec, torch.tensor([0.0, 0.0, 1.0, -0.5]))
    batch["old_log_probs"] = rec["rollout_log_probs"]
    with pytest.raises(KeyError, match="sample_mask"):
        actor.update_policy(batch, spec)
    with pytest.raises(ValueError, match="keeps no sample on any rank"):
        actor.update_policy(batch.clone().set("sample_mask", torch.zeros(4, dtype=torch.bool)), spec)
    assert not actor.engine.optimizer.state  # neither call stepped
    # the first mini-batch (rows 0, 1: an equal-reward group) is skipped: one optimizer step, for rows 2, 3
    metrics = actor.update_policy(batch.clone().set("sample_mask", torch.tensor([False, False, True, True])), spec)
    assert metrics["actor/skipped_mini_batches"] == 1
    assert {int(state["step"]) for state in actor.engine.optimizer.state.values()} == {1}
    assert 0 < metrics["actor/grad_norm"] < float("inf") and abs(metrics["actor/pg_loss"]) > 0


def test_offload_policy_puts_fsdp2_host_offload_on_every_block_and_changes_no_update(
    process_group, tiny_qwen_image_path, recorded_qwen_image_batch
):
    """``actor.engine.offload_policy=true`` (verl's key, which the engine used to drop): FSDP2's ``CPUOffloadPolicy``
    on every sharded block of the full fine-tuning model (parameters, gradients and AdamW state in host memory, the
    optimizer step on the host), verl's between-phase offload switched off, and the same update as without it. On
    CPU nothing moves; the memory it saves shows on an accelerator."""
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule

    from verl_omni.pipelines.sampling import SamplingSpec

    rec = recorded_qwen_image_batch[1]
    spec = SamplingSpec(**rec["spec"])
    batch = _batch(rec, torch.tensor([1.0, -1.0, 1.0, -1.0]))
    batch["old_log_probs"] = rec["rollout_log_probs"]
    log_probs = {}
    for offload in (False, True):
        engine_kwargs = {"offload_policy": offload, "optimizer_offload": offload}
        actor = _actor(tiny_qwen_image_path, lora_rank=0, lr=1e-4, ppo_mini_batch_size=4, engine_kwargs=engine_kwargs)
        # FSDP2 keeps the policy on each block's parameter group (no public accessor)
        groups = [
            m._get_fsdp_state()._fsdp_param_group for m in actor.engine.module.modules() if isinstance(m, FSDPModule)
        ]
        groups = [group for group in groups if group is not None]
        assert len(groups) > 1 and all(isinstance(g.offload_policy, CPUOffloadPolicy) == offload for g in groups)
        assert not actor.engine.is_optimizer_offload_enabled, "the policy owns placement: no between-phase offload"
        actor.update_policy(batch, spec)
        log_probs[offload] = actor.compute_log_prob(batch, spec)
    assert not torch.allclose(log_probs[False], rec["sanity_log_probs"], rtol=0, atol=1e-5), "the update moved"
    torch.testing.assert_close(log_probs[True], log_probs[False], rtol=0, atol=1e-6)

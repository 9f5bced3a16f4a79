"""The actor on one CUDA device (NCCL): replay matches the CPU sampler in fp32, and bf16 compute trains."""

from __future__ import annotations

import pytest
import torch
from actor_helpers import batch_of, build_actor
from figures import figure

pytestmark = pytest.mark.gpu


def test_fp32_replay_on_cuda_matches_cpu_sampler_and_update_direction(
    cuda_process_group, tiny_qwen_image_path, recorded_qwen_image_batch
):
    from verl_omni.pipelines.sampling import SamplingSpec

    rec = recorded_qwen_image_batch[1]
    spec = SamplingSpec(**rec["spec"])
    fp32 = {"mixed_precision": {"param_dtype": "fp32", "reduce_dtype": "fp32"}}
    actor = build_actor(tiny_qwen_image_path, engine_kwargs=fp32, ppo_mini_batch_size=4)
    batch = batch_of(rec, torch.ones(4))
    old = actor.compute_log_prob(batch, spec)
    figure("logprob_diff_fp32_cuda_vs_cpu_sampler", (old - rec["rollout_log_probs"]).abs().max().item())
    torch.testing.assert_close(old, rec["rollout_log_probs"], rtol=0, atol=1e-4)
    batch["old_log_probs"] = old
    metrics = actor.update_policy(batch, spec)
    assert 0 < metrics["actor/grad_norm"] < float("inf")
    # per sample (the loss averages a sample's W steps): one update need not raise every single step's log-prob
    assert bool(((actor.compute_log_prob(batch, spec) - old).mean(dim=1) > 0).all())


def test_bf16_compute_on_cuda_trains_with_finite_gradients(
    cuda_process_group, tiny_qwen_image_path, recorded_qwen_image_batch
):
    from verl_omni.pipelines.sampling import SamplingSpec

    rec = recorded_qwen_image_batch[1]
    spec = SamplingSpec(**rec["spec"])
    actor = build_actor(tiny_qwen_image_path, ppo_mini_batch_size=4)  # default on CUDA: bf16 compute
    batch = batch_of(rec, torch.tensor([1.0, -1.0, 1.0, -1.0]))
    batch["old_log_probs"] = actor.compute_log_prob(batch, spec)
    figure(
        "logprob_diff_bf16_cuda_vs_cpu_sampler", (batch["old_log_probs"] - rec["rollout_log_probs"]).abs().max().item()
    )
    assert bool(torch.isfinite(batch["old_log_probs"]).all())
    metrics = actor.update_policy(batch, spec)
    assert 0 < metrics["actor/grad_norm"] < float("inf")


def actor_with_forward_only_micro_batches(model_path, rec, spec, compiled: bool, dynamic: bool = False):
    """An actor whose forward-only micro-batches (4) are larger than the update's (2), and the recorded batch with
    its π_old replayed: the shapes a compiled block sees in a run."""
    actor = build_actor(
        model_path,
        model_kwargs={"compile_transformer_blocks": compiled, "compile_dynamic": dynamic},
        ppo_mini_batch_size=4,
        ppo_micro_batch_size_per_gpu=2,
        infer_micro_batch_size_per_gpu=4,
    )
    batch = batch_of(rec, torch.tensor([1.0, -1.0, 1.0, -1.0]))
    batch["old_log_probs"] = actor.compute_log_prob(batch, spec)
    return actor, batch


def test_compiled_transformer_blocks_replay_and_train_like_eager(
    cuda_process_group, tiny_qwen_image_path, recorded_qwen_image_batch
):
    """``model.compile_transformer_blocks``: the same bf16 log-probs and gradient as eager (one graph for the FSDP
    blocks, gradient checkpointing around it), with forward-only micro-batches larger than the update's."""
    from verl_omni.pipelines.sampling import SamplingSpec

    rec = recorded_qwen_image_batch[1]
    spec = SamplingSpec(**rec["spec"])
    results = {}
    for compiled in (False, True):
        actor, batch = actor_with_forward_only_micro_batches(tiny_qwen_image_path, rec, spec, compiled)
        metrics = actor.update_policy(batch, spec)
        results[compiled] = (batch["old_log_probs"], metrics["actor/grad_norm"])
    (eager_lp, eager_grad), (compiled_lp, compiled_grad) = results[False], results[True]
    # compiled vs eager, bf16
    figure("logprob_diff_compiled_vs_eager", (compiled_lp - eager_lp).abs().max().item())
    figure("grad_norm_compiled", compiled_grad, ".4e")
    figure("grad_norm_eager", eager_grad, ".4e")
    torch.testing.assert_close(compiled_lp, eager_lp, rtol=0, atol=2e-3)
    assert abs(compiled_grad - eager_grad) <= 0.05 * eager_grad


def test_reference_pass_first_then_update_on_the_rollout_log_probs(
    cuda_process_group, tiny_qwen_image_path, recorded_qwen_image_batch
):
    """With π_old taken from the rollout (``actor.use_rollout_log_probs``) and a KL term, the reference pass is the
    engine's first forward, run with the adapter disabled. FSDP2 takes each unit's gradient dtypes from the
    parameters that train at that first forward: the update must still hand the fp32 adapter fp32 gradients under
    the default bf16 compute (a reference pass that froze the adapter made every unit refuse them)."""
    from verl_omni.pipelines.sampling import SamplingSpec

    rec = recorded_qwen_image_batch[1]
    spec = SamplingSpec(**rec["spec"])
    actor = build_actor(
        tiny_qwen_image_path,
        lora_init=False,
        engine_kwargs={"model_dtype": "bf16"},
        ppo_mini_batch_size=4,
        kl_beta=0.1,
        use_rollout_log_probs=True,
    )
    batch = batch_of(rec, torch.tensor([1.0, -1.0, 1.0, -1.0]))
    batch["ref_prev_sample_mean"] = actor.compute_ref_prev_sample_mean(batch, spec)
    batch["rollout_log_probs"] = rec["rollout_log_probs"]
    lora_b = {n: p for n, p in actor.engine.module.named_parameters() if "lora_B" in n}
    before = {n: p.detach().full_tensor().clone() for n, p in lora_b.items()}
    metrics = actor.update_policy(batch, spec)
    figure("grad_norm_reference_first", metrics["actor/grad_norm"], ".4e")
    assert 0 < metrics["actor/grad_norm"] < float("inf")
    assert all(p.dtype == torch.float32 for p in lora_b.values())
    assert any(not torch.equal(before[n], lora_b[n].detach().full_tensor()) for n in before)


def _padded_text(batch, extra: int):
    """The batch with ``extra`` masked tokens after each prompt: a longer text length, the same samples."""
    longer = batch.clone()
    for key in ("prompt_embeds", "negative_prompt_embeds"):
        pad = torch.zeros_like(batch[key][:, :extra])
        longer[key] = torch.cat([batch[key], pad], dim=1)
        mask = torch.zeros_like(batch[f"{key}_mask"][:, :extra])
        longer[f"{key}_mask"] = torch.cat([batch[f"{key}_mask"], mask], dim=1)
    return longer


@pytest.mark.parametrize("dynamic", [False, True], ids=["compile_dynamic_false", "compile_dynamic_true"])
def test_compiled_blocks_and_new_text_lengths(
    dynamic, cuda_process_group, tiny_qwen_image_path, recorded_qwen_image_batch
):
    """``model.compile_dynamic``: false (torch's default) compiles once more at the first new text length and then
    takes any length; true takes a new length with the graphs it has. Either way the padded text gives the same
    log-probs, and the actor reports its compiled graphs."""
    from torch._dynamo.utils import counters

    from verl_omni.pipelines.sampling import SamplingSpec
    from verl_omni.workers.engine.fsdp.diffusers_impl import compiled_graph_count

    # no sizes remembered from the module's earlier compiles of the same block code
    torch._dynamo.reset()
    rec = recorded_qwen_image_batch[1]
    spec = SamplingSpec(**rec["spec"])
    actor, batch = actor_with_forward_only_micro_batches(tiny_qwen_image_path, rec, spec, True, dynamic)
    actor.update_policy(batch, spec)
    graphs = [counters["stats"]["unique_graphs"]]
    assert compiled_graph_count() == graphs[0] > 0
    for extra in (3, 7):
        # the unpadded text's log-probs under the weights of this round (each round's update moves them)
        repeated = actor.compute_log_prob(batch, spec)
        longer = _padded_text(batch, extra)
        longer["old_log_probs"] = actor.compute_log_prob(longer, spec)
        actor.update_policy(longer, spec)
        graphs.append(counters["stats"]["unique_graphs"])
        figure(f"logprob_diff_text_padded_by_{extra}", (longer["old_log_probs"] - repeated).abs().max().item())
        torch.testing.assert_close(longer["old_log_probs"], repeated, rtol=0, atol=2e-3)
    added = [after - before for before, after in zip(graphs, graphs[1:], strict=False)]
    figure("compiled_graphs_after_first_update", graphs[0], "d")
    figure("compiled_graphs_added_by_the_first_and_second_new_length", added)
    assert added[1] == 0, "a second new text length compiled again"
    assert (added[0] == 0) if dynamic else (added[0] > 0)

"""Gradient checkpointing on a share of the blocks (``model.gradient_checkpointing_fraction``,
:mod:`verl_omni.workers.engine.fsdp.block_checkpointing`): which blocks are recomputed, that the others are not, that
the gradient does not change, and the models that cannot take it."""

from __future__ import annotations

import pytest
import torch

from verl_omni.pipelines.model_base import get_model_adapter
from verl_omni.workers.engine.fsdp.block_checkpointing import checkpoint_share_of_blocks, recomputed_indices


@pytest.mark.parametrize(("count", "fraction"), [(60, 1.0), (60, 0.5), (60, 0.34), (10, 0.25), (7, 0.5)])
def test_the_recomputed_blocks_are_the_share_spread_over_the_forward(count, fraction):
    indices = recomputed_indices(count, fraction)
    assert len(indices) == int(fraction * count + 1e-9)
    # spread: no run of kept blocks longer than the share allows
    gaps = [b - a for a, b in zip(sorted(indices), sorted(indices)[1:], strict=False)]
    assert max(gaps, default=1) <= -(-1 // fraction) + 1


def replay_gradient(path, fraction: float) -> tuple[dict[str, torch.Tensor], list[int]]:
    """One replayed SDE step of the tiny Qwen-Image and its backward, with ``fraction`` of the blocks checkpointed:
    the transformer's gradients, and how often each block's forward ran (a recomputed block runs twice)."""
    from verl_omni.pipelines.sampling import SamplingSpec
    from verl_omni.workers.utils.replay import prepare_scheduler, replay_step

    adapter = get_model_adapter(path)
    torch.manual_seed(0)
    model = adapter.build_module(path).requires_grad_(True)
    assert checkpoint_share_of_blocks(model, adapter.fsdp_wrap_blocks, fraction) == len(
        recomputed_indices(len(model.transformer_blocks), fraction)
    )
    calls = [0] * len(model.transformer_blocks)
    for i, block in enumerate(model.transformer_blocks):
        # a pre-hook: the recompute stops early once it has what the backward needs, before any forward hook runs
        block.register_forward_pre_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
    spec = SamplingSpec(num_inference_steps=4, height=64, width=64, noise_level=0.7, true_cfg_scale=1.0)
    scheduler = adapter.build_scheduler(path)
    vae_scale_factor = adapter.vae_scale_factor(path)
    cells = (64 // (2 * vae_scale_factor)) ** 2
    prepare_scheduler(adapter, scheduler, spec, cells)
    batch = {
        "all_latents": torch.randn(2, 2, cells, model.config.in_channels),
        "all_timesteps": scheduler.timesteps[:1].expand(2, 1),
        "prompt_embeds": torch.randn(2, 6, model.config.joint_attention_dim),
        "prompt_embeds_mask": torch.ones(2, 6, dtype=torch.long),
    }
    replay_step(adapter, model, scheduler, batch, 0, spec, vae_scale_factor).log_prob.sum().backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}, calls


def test_a_half_of_the_blocks_recomputes_and_the_gradient_is_the_full_checkpointings(tiny_qwen_image_path):
    full, full_calls = replay_gradient(tiny_qwen_image_path, 1.0)
    half, half_calls = replay_gradient(tiny_qwen_image_path, 0.5)
    recomputed = recomputed_indices(len(half_calls), 0.5)
    assert full_calls == [2] * len(full_calls), "every block's forward runs again in the backward"
    assert half_calls == [2 if i in recomputed else 1 for i in range(len(half_calls))]
    assert full.keys() == half.keys() and full
    for name, grad in full.items():
        torch.testing.assert_close(half[name], grad, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("builder", ["sd3", "bagel", "wan2_2_a14b"])
def test_a_model_takes_the_share_or_is_refused_naming_the_key(tiny_model, builder):
    path = tiny_model(builder)
    adapter = get_model_adapter(path)
    model = adapter.build_module(path)
    takes_a_function = builder == "sd3"
    if takes_a_function:
        assert checkpoint_share_of_blocks(model, adapter.fsdp_wrap_blocks, 0.5) > 0
        return
    with pytest.raises(ValueError, match="gradient_checkpointing_fraction=0.5.*set the fraction to 1.0"):
        checkpoint_share_of_blocks(model, adapter.fsdp_wrap_blocks, 0.5)

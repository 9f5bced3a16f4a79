"""BAGEL's training module on the actor's replay API: one-rank FSDP2 engine (gloo), peft LoRA, tiny random BAGEL.

The batch is synthetic (latents on BAGEL's schedule, prompt token ids): what is checked is that the
engine's replay equals the plain module's, that only the generation expert's LoRA trains, and that
exported LoRA names are the rollout's. Rollout-vs-replay agreement is in
``tests/workers/rollout/vllm_omni/test_bagel_rollout_engine.py``.
"""

from __future__ import annotations

import pytest
import torch
from actor_helpers import build_actor
from tensordict import TensorDict

STEPS, SIZE, TOKENS = 4, 32, 4  # 32 px → 2×2 latent tokens
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def spec():
    from verl_omni.pipelines.sampling import SamplingSpec

    return SamplingSpec(
        num_inference_steps=STEPS,
        height=SIZE,
        width=SIZE,
        noise_level=0.7,
        sde_type="sde",
        true_cfg_scale=4.0,
        model_kwargs={"timestep_shift": 3.0},
    )


@pytest.fixture(scope="module")
def batch():
    from verl_omni.pipelines.bagel.training_adapter import bagel_sigmas

    gen = torch.Generator().manual_seed(0)
    sigmas = bagel_sigmas(STEPS, 3.0)
    ids = torch.randint(10, 600, (4, 7), generator=gen)
    fields = {
        "all_latents": torch.randn(4, 3, TOKENS, 64, generator=gen),
        "all_timesteps": torch.stack([sigmas[[0, 1]], sigmas[[1, 2]], sigmas[[2, 3]], sigmas[[0, 1]]]),
        "prompt_token_ids": ids,
        "prompt_token_ids_mask": torch.ones_like(ids),
        "negative_prompt_token_ids": torch.zeros(4, 0, dtype=torch.long),
        "negative_prompt_token_ids_mask": torch.zeros(4, 0, dtype=torch.long),
        "advantages": torch.ones(4),
    }
    return TensorDict(fields, batch_size=[4])


def test_bagel_actor_replays_like_the_module_and_trains_only_the_generation_expert_lora(
    process_group, tiny_bagel_path, spec, batch, tmp_path
):
    from verl_omni.pipelines.bagel.training_adapter import BagelTrainingAdapter as adapter
    from verl_omni.workers.utils.replay import prepare_scheduler, replay_step

    actor = build_actor(tiny_bagel_path, ppo_mini_batch_size=4)
    engine = actor.engine

    # 1. the sharded engine (zero-init LoRA) replays exactly like the plain module
    module = adapter.build_module(tiny_bagel_path).eval()
    scheduler = adapter.build_scheduler(tiny_bagel_path)
    prepare_scheduler(adapter, scheduler, spec, TOKENS)
    with torch.no_grad():
        plain = torch.stack([replay_step(adapter, module, scheduler, batch, j, spec).log_prob for j in range(2)], 1)
    old = actor.compute_log_prob(batch, spec)
    assert bool(torch.isfinite(old).all())
    torch.testing.assert_close(old, plain, rtol=0, atol=1e-5)

    # 2. only LoRA of the generation expert's MLP is trainable; a positive-advantage update raises log-probs
    trainable = [n for n, p in engine.module.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n and ".mlp_moe_gen." in n for n in trainable)
    batch = batch.clone()
    batch["old_log_probs"] = old
    metrics = actor.update_policy(batch, spec)
    assert 0 < metrics["actor/grad_norm"] < float("inf")
    assert bool((actor.compute_log_prob(batch, spec) > old).all())
    # the reference (LoRA off) is still the base model
    ref = actor.compute_ref_prev_sample_mean(batch, spec)
    base = torch.stack([replay_step(adapter, module, scheduler, batch, j, spec).prev_sample_mean for j in range(2)], 1)
    torch.testing.assert_close(ref, base.detach(), rtol=0, atol=1e-5)

    # 3. checkpoint (BAGEL has no diffusers pipeline: plain safetensors, same keys) restores the trained policy
    trained = actor.compute_log_prob(batch, spec)
    engine.save_checkpoint(str(tmp_path / "ckpt"), global_step=1)
    fresh = build_actor(tiny_bagel_path, ppo_mini_batch_size=4)
    fresh.engine.load_checkpoint(str(tmp_path / "ckpt"))
    torch.testing.assert_close(fresh.compute_log_prob(batch, spec), trained, rtol=0, atol=0)

    # 4. export: names and targets as vLLM-Omni's BAGEL pipeline names its layers
    params, config = engine.get_per_tensor_param()
    names = sorted(name for name, _ in params)
    assert "base_model.model.layers.0.mlp_moe_gen.gate_proj.lora_A.weight" in names
    assert all(name.startswith("base_model.model.layers.") for name in names)
    assert config["target_modules"] == sorted(adapter.lora_target_modules)

"""``DiffusionActorWorker`` as a verl single-controller worker group: two Ray CPU workers, real FSDP2 over gloo."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def worker_group(ray_driver, tiny_qwen_image_path):
    import ray
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, TrainingWorkerConfig

    from verl_omni.algorithms.flow_grpo import FlowGRPOAlgoConfig
    from verl_omni.workers.config.actor import DiffusionActorConfig
    from verl_omni.workers.config.model import DiffusionLoraConfig, DiffusionModelConfig
    from verl_omni.workers.engine_workers import DiffusionActorWorker

    config = TrainingWorkerConfig(
        model_type="diffusion_model",
        model_config=DiffusionModelConfig(path=str(tiny_qwen_image_path), lora=DiffusionLoraConfig(rank=4, alpha=8)),
        engine_config=FSDPEngineConfig(strategy="fsdp2", seed=7),
        optimizer_config=FSDPOptimizerConfig(lr=1e-2, weight_decay=0.0, total_training_steps=10),
        checkpoint_config=CheckpointConfig(),
    )
    actor_config = DiffusionActorConfig(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=1, clip_ratio=0.2)
    cls = RayClassWithInitArgs(
        cls=ray.remote(DiffusionActorWorker),
        config=config,
        actor_config=actor_config,
        algorithm_config=FlowGRPOAlgoConfig(),
    )
    pool = RayResourcePool([2], use_gpu=False, max_colocate_count=1)
    group = RayWorkerGroup(pool, cls, device_name="cpu")
    group.init_model()
    yield group


def _data(rec: dict):
    from verl import DataProto

    keys = ("all_latents", "all_timesteps", "prompt_embeds", "prompt_embeds_mask")
    keys += ("negative_prompt_embeds", "negative_prompt_embeds_mask")
    return DataProto.from_dict(tensors={k: rec[k] for k in keys}, meta_info={"sampling_spec": rec["spec"]})


def test_worker_group_replays_updates_exports_and_saves(worker_group, recorded_qwen_image_batch, tmp_path):
    rec = recorded_qwen_image_batch[1]
    data = _data(rec)

    # old log-probs, split over the two ranks and gathered in order, equal the one-process reference
    old = worker_group.compute_log_prob(data).batch["old_log_probs"]
    torch.testing.assert_close(old, rec["sanity_log_probs"], rtol=0, atol=1e-5)
    ref = worker_group.compute_ref_log_prob(data).batch["ref_prev_sample_mean"]
    torch.testing.assert_close(ref, rec["base_prev_sample_mean"], rtol=0, atol=1e-5)

    # an update with A = +1 raises each sample's log-prob (the loss averages a sample's W steps: one step may not move)
    data.batch["old_log_probs"] = old
    data.batch["advantages"] = torch.ones(old.shape[0])
    metrics = worker_group.update_actor(data).meta_info["metrics"]
    # verl gathers metrics per rank; ours are reduced over ranks already, so both ranks agree
    assert all(len(set(values)) == 1 for values in metrics.values()), metrics
    assert 0 < metrics["actor/grad_norm"][0] < float("inf")
    assert metrics["actor/pg_loss"][0] == pytest.approx(-1.0)
    new = worker_group.compute_log_prob(data).batch["old_log_probs"]
    assert bool(((new - old).mean(dim=1) > 0).all())

    # LoRA export: the same full tensors on both ranks, peft naming and config for the rollout
    (tensors, config), (tensors_1, _) = worker_group.get_lora_params()
    assert tensors and all(name.startswith("base_model.model.transformer_blocks.") for name in tensors)
    assert all(torch.equal(tensors[k], tensors_1[k]) for k in tensors)
    assert (config["r"], config["lora_alpha"]) == (4, 8)
    assert any(t.abs().sum() > 0 for name, t in tensors.items() if "lora_B" in name)

    worker_group.save_checkpoint(str(tmp_path / "ckpt"), global_step=1)
    saved = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert saved == ["engine_state_rank0_of2.pt", "engine_state_rank1_of2.pt", "lora"]

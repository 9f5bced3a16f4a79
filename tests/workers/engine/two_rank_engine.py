"""Two-rank scenarios for ``DiffusersFSDPEngine``, run under ``torch.distributed.run`` by the tests.

``python -m torch.distributed.run --nproc_per_node 2 two_rank_engine.py RECORDED.pt MODEL_DIR OUT_DIR``

First the old-policy adapter's scenario (``old_adapter_engine.py``: ``OUT_DIR/old_adapter/results.pt``; first,
because it counts the transformers alive in the process), then the engine's: the recorded batch (sampled once per
session by the ``recorded_qwen_image_batch`` fixture) is split between the two gloo ranks; each scenario step
writes its numbers, gathered on rank 0, to ``OUT_DIR/results.pt``. One launch for both: each rank's imports and
first engine build are most of a launch. The assertions live in ``test_diffusers_fsdp_engine.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from tensordict import TensorDict

LR = 1e-2


def build_engine(
    model_path: str, micro_batch: int = 1, optimizer: str = "AdamW", mini_batch: int = 4, algorithm_config=None
):
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig
    from verl.workers.engine.base import EngineRegistry

    from verl_omni.algorithms.flow_grpo import FlowGRPOAlgoConfig
    from verl_omni.workers.actor.diffusion_actor import DiffusionActor
    from verl_omni.workers.config.actor import DiffusionActorConfig
    from verl_omni.workers.config.model import DiffusionLoraConfig, DiffusionModelConfig

    model = DiffusionModelConfig(path=model_path, lora=DiffusionLoraConfig(rank=4, alpha=8))
    engine_config = FSDPEngineConfig(strategy="fsdp2", seed=7)
    optim = FSDPOptimizerConfig(
        optimizer=optimizer, lr=LR, lr_warmup_steps=2, total_training_steps=10, weight_decay=0.0, clip_grad=1.0
    )
    engine = EngineRegistry.new("diffusion_model", "fsdp2", model, engine_config, optim, CheckpointConfig())
    engine.initialize()
    actor_config = DiffusionActorConfig(
        ppo_mini_batch_size=mini_batch, ppo_micro_batch_size_per_gpu=micro_batch, clip_ratio=0.2, kl_beta=0.0
    )
    return engine, DiffusionActor(engine, actor_config, algorithm_config or FlowGRPOAlgoConfig())


def gather(t: torch.Tensor) -> torch.Tensor:
    """Concatenate each rank's rows in rank order."""
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts)


def local_batch(rec: dict, advantages: torch.Tensor) -> TensorDict:
    rank, world = dist.get_rank(), dist.get_world_size()
    keys = ("all_latents", "all_timesteps", "prompt_embeds", "prompt_embeds_mask")
    keys += ("negative_prompt_embeds", "negative_prompt_embeds_mask")
    fields = {k: rec[k].chunk(world)[rank] for k in keys}
    fields["advantages"] = advantages.chunk(world)[rank]
    return TensorDict(fields, batch_size=[fields["all_latents"].shape[0]])


def _rows(rec: dict, count: int, advantages: torch.Tensor) -> dict[str, torch.Tensor]:
    """The first ``count`` rows of the recorded batch (every rank's view) with ``advantages``."""
    keys = ("all_latents", "all_timesteps", "prompt_embeds", "prompt_embeds_mask")
    keys += ("negative_prompt_embeds", "negative_prompt_embeds_mask")
    return {k: rec[k][:count] for k in keys} | {"advantages": advantages}


def lora_params(engine) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in engine.lora_state_dict().items()}


def main(recorded: str, model_path: str, out_dir: str) -> None:
    import old_adapter_engine
    from torch.distributed.tensor import DTensor

    from verl_omni.pipelines.sampling import SamplingSpec

    dist.init_process_group("gloo")
    out = Path(out_dir)
    old_adapter_engine.scenario(model_path, out / "old_adapter")
    rec = torch.load(recorded, weights_only=False)
    spec = SamplingSpec(**rec["spec"])
    size = rec["all_latents"].shape[0]
    results: dict = {}

    # 1. sharding, replay against the one-process reference, reference = base model
    engine, actor = build_engine(model_path)
    sharded = [p for p in engine.module.parameters() if isinstance(p, DTensor)]
    results["all_params_dtensor"] = len(sharded) == len(list(engine.module.parameters()))
    results["lora_local_fraction"] = sum(p.to_local().numel() for p in sharded if p.requires_grad) / sum(
        p.numel() for p in sharded if p.requires_grad
    )
    pos = local_batch(rec, torch.ones(size))
    results["old_log_probs"] = gather(actor.compute_log_prob(pos, spec))
    results["ref_mean_before"] = gather(actor.compute_ref_prev_sample_mean(pos, spec))

    # 2. one update with positive advantages (old log-probs from the engine itself)
    pos["old_log_probs"] = actor.compute_log_prob(pos, spec)
    results["metrics_pos"] = actor.update_policy(pos, spec)
    results["new_log_probs_pos"] = gather(actor.compute_log_prob(pos, spec))
    results["policy_mean_after"] = gather(actor.infer(pos, spec)["prev_sample_mean"])
    results["ref_mean_after"] = gather(actor.compute_ref_prev_sample_mean(pos, spec))

    # 3. checkpoint: save, fresh engine, load, same outputs; one more update on both stays equal
    ckpt = out / "ckpt"
    engine.save_checkpoint(str(ckpt), global_step=1)
    rng_after_save = torch.rand(3)
    fresh, fresh_actor = build_engine(model_path)
    fresh.load_checkpoint(str(ckpt))
    results["rng_restored"] = bool(torch.equal(torch.rand(3), rng_after_save))
    results["resumed_log_probs"] = gather(fresh_actor.compute_log_prob(pos, spec))
    actor.update_policy(pos, spec)
    fresh_actor.update_policy(pos, spec)
    a, b = lora_params(engine), lora_params(fresh)
    results["resume_second_update_max_diff"] = max((a[k] - b[k]).abs().max().item() for k in a)
    results["lr_after_two_updates"] = (engine.lr_scheduler.get_last_lr()[0], fresh.lr_scheduler.get_last_lr()[0])
    del fresh, fresh_actor, engine, actor

    # 4. negative advantages lower the log-probs
    engine, actor = build_engine(model_path)
    neg = local_batch(rec, -torch.ones(size))
    neg["old_log_probs"] = actor.compute_log_prob(neg, spec)
    results["metrics_neg"] = actor.update_policy(neg, spec)
    results["new_log_probs_neg"] = gather(actor.compute_log_prob(neg, spec))
    del engine, actor

    # 5. gradient accumulation: micro-batch 1 and 2 accumulate the same gradient (SGD: Δθ = −lr·g)
    mixed = local_batch(rec, torch.tensor([1.0, -1.0] * (size // 2)))
    steps = []
    for micro in (1, 2):
        engine, actor = build_engine(model_path, micro_batch=micro, optimizer="SGD")
        before = lora_params(engine)
        batch = mixed.clone()
        batch["old_log_probs"] = actor.compute_log_prob(batch, spec)
        actor.update_policy(batch, spec)
        after = lora_params(engine)
        steps.append({k: after[k] - before[k] for k in after})
        del engine, actor
    results["micro_batch_step_max_abs"] = max(v.abs().max().item() for v in steps[0].values())
    results["micro_batch_step_max_diff"] = max((steps[0][k] - steps[1][k]).abs().max().item() for k in steps[0])

    # 6. algorithm.drop_zero_std_groups: rank 1's rows are all left out (it back-propagates zeros and reports no
    # loss metric); the SGD step equals the step on the kept rows alone, spread one per rank
    from verl_omni.algorithms.flow_grpo import FlowGRPOAlgoConfig

    keep = torch.tensor([True, True] + [False] * (size - 2))
    rank, world = dist.get_rank(), dist.get_world_size()
    kept_alone = {k: v.chunk(world)[rank] for k, v in _rows(rec, 2, torch.tensor([1.0, -1.0])).items()}
    runs = {
        "masked": (mixed.clone().set("sample_mask", keep.chunk(world)[rank]), 4, True),
        "kept_alone": (TensorDict(kept_alone, batch_size=[2 // world]), 2, False),
    }
    steps = {}
    for name, (batch, mini, drop) in runs.items():
        algorithm = FlowGRPOAlgoConfig(drop_zero_std_groups=drop)
        engine, actor = build_engine(model_path, optimizer="SGD", mini_batch=mini, algorithm_config=algorithm)
        before = lora_params(engine)
        batch["old_log_probs"] = actor.compute_log_prob(batch, spec)
        results[f"metrics_{name}"] = actor.update_policy(batch, spec)
        after = lora_params(engine)
        steps[name] = {k: after[k] - before[k] for k in after}
        del engine, actor
    results["mask_step_max_abs"] = max(v.abs().max().item() for v in steps["kept_alone"].values())
    results["mask_step_max_diff"] = max(
        (steps["masked"][k] - steps["kept_alone"][k]).abs().max().item() for k in steps["masked"]
    )

    if dist.get_rank() == 0:
        torch.save(results, out / "results.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])

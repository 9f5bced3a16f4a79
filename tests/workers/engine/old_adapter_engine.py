"""Two-rank scenario of the old-policy adapter (DiffusionNFT) on ``DiffusersFSDPEngine``: :func:`scenario`, run
first in ``two_rank_engine.py``'s launch (one launch, so its two ranks import torch, verl and diffusers once for
both scenarios).

An ODE-samples batch (random clean latents and prompt embeddings of the tiny model's shapes) is
trained on with ``algorithm=diffusion_nft``'s loss; the numbers go to ``OUT_DIR/results.pt`` (rank 0); the
assertions live in ``test_diffusers_fsdp_engine.py``.
"""

from __future__ import annotations

import gc
from pathlib import Path

import torch
import torch.distributed as dist
from tensordict import TensorDict

HEIGHT = WIDTH = 64


def build(model_path: str):
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig
    from verl.workers.engine.base import EngineRegistry

    from verl_omni.algorithms.diffusion_nft import DiffusionNFTConfig
    from verl_omni.workers.actor.diffusion_actor import DiffusionActor
    from verl_omni.workers.config.actor import DiffusionActorConfig
    from verl_omni.workers.config.model import DiffusionLoraConfig, DiffusionModelConfig

    model = DiffusionModelConfig(path=model_path, lora=DiffusionLoraConfig(rank=4, alpha=8))
    optim = FSDPOptimizerConfig(
        optimizer="AdamW", lr=1e-2, lr_warmup_steps=1, total_training_steps=10, weight_decay=0.0
    )
    engine = EngineRegistry.new(
        "diffusion_model", "fsdp2", model, FSDPEngineConfig(strategy="fsdp2", seed=7), optim, CheckpointConfig()
    )
    # what DiffusionActorWorker.init_model does with the algorithm's Phases
    engine.old_policy_adapter = True
    engine.initialize()
    actor_config = DiffusionActorConfig(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=1)
    return engine, DiffusionActor(engine, actor_config, DiffusionNFTConfig(decay_rate=0.25, decay_max=0.6))


def local_batch(engine, rank: int, world: int, advantages: torch.Tensor) -> TensorDict:
    config, cell = engine.module.config, 2 * engine.vae_scale_factor
    size, tokens = advantages.shape[0], (HEIGHT // cell) * (WIDTH // cell)
    g = torch.Generator().manual_seed(0)
    fields = {
        "clean_latents": torch.randn(size, tokens, config.in_channels, generator=g),
        "prompt_embeds": torch.randn(size, 5, config.joint_attention_dim, generator=g),
        "prompt_embeds_mask": torch.ones(size, 5, dtype=torch.long),
        "advantages": advantages,
    }
    fields = {k: v.chunk(world)[rank] for k, v in fields.items()}
    return TensorDict(fields, batch_size=[fields["advantages"].shape[0]])


def local_adapters(module) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """This rank's shards of the trained and the old adapter, by the trained tensor's name."""
    from verl_omni.workers.engine.fsdp.old_adapter import adapter_pairs

    names = {id(p): n for n, p in module.named_parameters()}
    trained, old = {}, {}
    for t, o in adapter_pairs(module):
        trained[names[id(t)]] = t.to_local().detach().clone()
        old[names[id(t)]] = o.to_local().detach().clone()
    return trained, old


def scenario(model_path: str, out_dir: Path) -> None:
    """The scenario on the ranks of the initialized default group; rank 0 writes ``out_dir/results.pt``."""
    from diffusers import QwenImageTransformer2DModel

    from verl_omni.pipelines.model_base import get_model_adapter
    from verl_omni.pipelines.sampling import SamplingSpec

    rank, world = dist.get_rank(), dist.get_world_size()
    results: dict = {}
    engine, actor = build(model_path)
    module = engine.module

    # 1. one transformer in the process; its parameters: base + two LoRA adapters of equal size
    gc.collect()
    results["transformers"] = sum(isinstance(o, QwenImageTransformer2DModel) for o in gc.get_objects())
    base = get_model_adapter(model_path).build_module(model_path)
    results["base_params"] = sum(p.numel() for p in base.parameters())
    del base
    names = [n for n, _ in module.named_parameters()]
    results["trained_params"] = sum(p.numel() for n, p in module.named_parameters() if ".default." in n)
    results["old_params"] = sum(p.numel() for n, p in module.named_parameters() if ".old." in n)
    results["actor_params"] = sum(p.numel() for p in module.parameters())
    results["old_trainable"] = any(p.requires_grad for n, p in module.named_parameters() if ".old." in n)
    results["optimizer_tensors"] = sum(len(g["params"]) for g in engine.optimizer.param_groups)
    results["trained_tensors"] = sum(".default." in n for n in names)
    trained0, old0 = local_adapters(module)
    results["old_starts_equal"] = all(torch.equal(trained0[k], old0[k]) for k in trained0)

    # 2. two updates; after each, old = decay·old_before + (1 − decay)·trained_after, exactly, per tensor
    spec = SamplingSpec(num_inference_steps=4, height=HEIGHT, width=WIDTH, noise_level=0.0, true_cfg_scale=1.0)
    batch = local_batch(engine, rank, world, torch.tensor([1.0, -1.0, 2.0, -0.5]))
    results["metrics"], results["ema_max_error"], results["old_moved"] = [], [], []
    for _ in range(2):
        _, old_before = local_adapters(module)
        results["metrics"].append(actor.update_policy(batch, spec))
        trained, old = local_adapters(module)
        decay = results["metrics"][-1]["actor/old_policy_decay"]
        errors = [(old[k] - (old_before[k] * decay + trained[k] * (1.0 - decay))).abs().max() for k in old]
        results["ema_max_error"].append(max(e.item() for e in errors))
        results["old_moved"].append(max((old[k] - old_before[k]).abs().max().item() for k in old))
    results["trained_moved"] = max((trained[k] - trained0[k]).abs().max().item() for k in trained)
    results["still_active"] = list(module.active_adapters())

    # 3. a checkpoint keeps the old adapter and the step count its decay reads: a third update moves both,
    # loading the checkpoint brings back the saved ones
    engine.save_checkpoint(str(Path(out_dir) / "ckpt"), global_step=2)
    saved_steps, (saved_trained, saved_old) = engine.optimizer_steps, local_adapters(module)
    actor.update_policy(batch, spec)
    results["third_update_moved_old"] = any(
        not torch.equal(local_adapters(module)[1][k], saved_old[k]) for k in saved_old
    )
    engine.load_checkpoint(str(Path(out_dir) / "ckpt"))
    trained, old = local_adapters(module)
    results["resumed_steps"] = (saved_steps, engine.optimizer_steps)
    results["resumed_equal"] = all(torch.equal(old[k], saved_old[k]) for k in old) and all(
        torch.equal(trained[k], saved_trained[k]) for k in trained
    )
    results["resumed_decay"] = actor.update_policy(batch, spec)["actor/old_policy_decay"]

    if rank == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
        torch.save(results, out_dir / "results.pt")
    del engine, actor, module
    gc.collect()
    dist.barrier()

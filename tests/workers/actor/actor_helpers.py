"""Builders shared by the actor tests (CPU and GPU)."""

from __future__ import annotations

import torch
from tensordict import TensorDict


def build_actor(
    model_path,
    lora_init=True,
    engine_kwargs=None,
    algorithm_config=None,
    lora_rank=4,
    lr=1e-2,
    model_kwargs=None,
    **actor_kwargs,
):
    """A ``DiffusionActor`` on a freshly initialized one-process-group engine (LoRA r=``lora_rank``, 0: full
    fine-tuning; AdamW ``lr``; further ``model_kwargs`` of the model config), running ``algorithm_config``'s
    algorithm (None: Flow-GRPO with its defaults)."""
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig
    from verl.workers.engine.base import EngineRegistry

    from verl_omni.algorithms import get_algorithm
    from verl_omni.workers.actor.diffusion_actor import DiffusionActor
    from verl_omni.workers.config.actor import DiffusionActorConfig
    from verl_omni.workers.config.model import DiffusionLoraConfig, DiffusionModelConfig

    model = DiffusionModelConfig(
        path=str(model_path),
        lora=DiffusionLoraConfig(rank=lora_rank, alpha=8, init_lora_weights=lora_init),
        **(model_kwargs or {}),
    )
    optim = FSDPOptimizerConfig(lr=lr, weight_decay=0.0, total_training_steps=10)
    engine = EngineRegistry.new(
        "diffusion_model",
        "fsdp2",
        model,
        FSDPEngineConfig(strategy="fsdp2", seed=1, **(engine_kwargs or {})),
        optim,
        CheckpointConfig(),
    )
    # one sample per forward unless a test asks otherwise: the actor tests' batches are a few samples
    actor_kwargs.setdefault("ppo_micro_batch_size_per_gpu", 1)
    actor_config = DiffusionActorConfig(clip_ratio=0.2, **actor_kwargs)
    algorithm_config = algorithm_config or get_algorithm("flow_grpo").config_cls()
    # as DiffusionActorWorker.init_model: an old-policy adapter must exist before FSDP wraps the module
    phases = get_algorithm(algorithm_config.name).phases(algorithm_config, actor_config)
    engine.old_policy_adapter = phases.old_policy_adapter
    engine.needs_reference = phases.reference
    engine.reference_in_update = phases.reference_in_update
    engine.ema_decay = actor_config.ema_decay
    engine.initialize()
    return DiffusionActor(engine, actor_config, algorithm_config)


def batch_of(rec: dict, advantages: torch.Tensor) -> TensorDict:
    """The recorded batch as the actor takes it, with the given advantages."""
    keys = ("all_latents", "all_timesteps", "prompt_embeds", "prompt_embeds_mask")
    keys += ("negative_prompt_embeds", "negative_prompt_embeds_mask")
    fields = {k: rec[k] for k in keys} | {"advantages": advantages}
    return TensorDict(fields, batch_size=[advantages.shape[0]])

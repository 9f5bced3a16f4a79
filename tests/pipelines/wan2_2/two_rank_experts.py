"""Two gloo ranks of ``DiffusersFSDPEngine`` on the tiny A14B, each holding samples of one expert only.

``python -m torch.distributed.run --nproc_per_node 2 two_rank_experts.py BATCH.pt MODEL_DIR OUT.pt``

Rank 0 gets the batch's high-noise rows (``transformer``), rank 1 its low-noise rows (``transformer_2``): FSDP2's
collectives run only if both ranks run both experts (``experts.agreed_experts``). One replay step's loss
(mean squared velocity over the rank's rows) is backpropagated; rank 0 writes the LoRA weights the engine started
from and their gradients, averaged over the ranks, unsharded. The assertions live in ``test_wan2_2_a14b_lora.py``.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist


def main(batch_path: str, model_path: str, out_path: str) -> None:
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig
    from verl.workers.engine.base import EngineRegistry

    import verl_omni.workers.engine.fsdp.diffusers_impl  # noqa: F401  (registers the diffusion_model engine)
    from verl_omni.pipelines.sampling import SamplingSpec
    from verl_omni.pipelines.wan2_2.training_adapter import Wan22A14BTrainingAdapter as adapter
    from verl_omni.workers.config.model import DiffusionLoraConfig, DiffusionModelConfig
    from verl_omni.workers.engine.fsdp.checkpoint import gather_lora_state_dict

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    # a random B as well as A: every LoRA tensor gets a gradient
    lora = DiffusionLoraConfig(rank=4, alpha=8, init_lora_weights=False)
    model = DiffusionModelConfig(path=model_path, lora=lora)
    optim = FSDPOptimizerConfig(lr=1e-3, total_training_steps=1)
    engine = EngineRegistry.new(
        "diffusion_model", "fsdp2", model, FSDPEngineConfig(strategy="fsdp2", seed=7), optim, CheckpointConfig()
    )
    engine.initialize()
    start = gather_lora_state_dict(engine.module)

    batch = torch.load(batch_path)
    high = adapter.high_noise(batch["all_timesteps"][:, 0])
    rows = high if rank == 0 else ~high
    local = {k: v[rows] for k, v in batch.items()}
    spec = SamplingSpec(num_inference_steps=4, height=16, width=16, num_frames=5, true_cfg_scale=1.0)
    engine.module.train()
    velocity = adapter.step_velocity(engine.module, local, 0, spec, 8)
    velocity.square().mean().backward()

    grads = {}
    for name, param in engine.module.named_parameters():
        if param.requires_grad:
            grad = param.grad.full_tensor() if hasattr(param.grad, "full_tensor") else param.grad
            grads[name] = grad.detach().cpu().clone()
    if rank == 0:
        torch.save({"start": start, "grads": grads, "rows": [int(high.sum()), int((~high).sum())]}, out_path)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])

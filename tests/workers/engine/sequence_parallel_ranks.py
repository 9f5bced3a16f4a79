"""Two gloo ranks replaying one batch at sequence-parallel degree 1 (two data-parallel ranks) and 2 (one group).

``python -m torch.distributed.run --standalone --nproc_per_node 2 sequence_parallel_ranks.py DEVICE OUT_DIR CASE...``

Each ``CASE`` is ``MODEL:COMPUTE:DIR`` and writes ``OUT_DIR/MODEL-COMPUTE.pt``; the cases run one after the other in
one launch, because a launch is mostly its two ranks importing torch, verl and diffusers. ``MODEL`` is ``wan2_2``,
``wan2_2_a14b``, ``wan2_2_i2v_a14b``, ``qwen_image`` or ``flux2_klein`` (a tiny checkpoint in ``DIR``). The batch (4
samples, a window of 2 recorded steps, true CFG, prompts of unequal lengths) is built from a seed on every rank,
each rank given its half as the worker would. At each degree the engine replays it forward-only (the log-probs,
gathered in rank order), then once with a loss and a backward (the LoRA gradients, unsharded), and at degree 2 saves
a checkpoint that a degree-1 engine loads (its log-probs). Rank 0 writes the numbers; the assertions live in
``test_sequence_parallel.py`` (CPU: gloo, fp32, and bf16 for both Wan2.2 models) and
``test_sequence_parallel_gpu.py`` (``cuda``: a GPU per rank, NCCL, the engine's default bf16 compute). ``DEVICE``:
``cpu`` or ``cuda``; ``COMPUTE``: ``default`` (the engine's choice: fp32 on CPU, bf16 on a GPU) or a precision name
FSDP2 computes in (``bf16``: the GPU run's precision on gloo; ``fp32``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from tensordict import TensorDict

SAMPLES, WINDOW = 4, 2
TEXT_DIM_KEYS = {
    "wan2_2": "text_dim",
    "wan2_2_a14b": "text_dim",
    "wan2_2_i2v_a14b": "text_dim",
    "qwen_image": "joint_attention_dim",
    "flux2_klein": "joint_attention_dim",
}
# the SGD step's learning rate: one that moves the log-probs measurably (the tiny FLUX.2-klein's LoRA, on its one
# double-stream block, gets gradients too small for the others' 10)
LEARNING_RATE = {"flux2_klein": 1e4}
# FLUX.2-klein's prompts are padded to a fixed length (the pipelines' 512 tokens, padding read) and have no mask
FIXED_TEXT_LENGTH = {"flux2_klein": 512}
SIZE = {
    "wan2_2": dict(height=64, width=64, num_frames=5),
    "wan2_2_a14b": dict(height=32, width=32, num_frames=5),
    "wan2_2_i2v_a14b": dict(height=32, width=32, num_frames=5),
    "qwen_image": dict(height=64, width=32, num_frames=1),
    "flux2_klein": dict(height=64, width=32, num_frames=1),
}


def build_engine(model_path: str, degree: int, compute: str, lr: float = 10.0):
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig
    from verl.workers.engine.base import EngineRegistry

    import verl_omni.workers.engine.fsdp.diffusers_impl  # noqa: F401  (registers the diffusion_model engine)
    from verl_omni.workers.config.model import DiffusionLoraConfig, DiffusionModelConfig

    # a random B as well as A: every LoRA tensor gets a gradient and moves the log-probs
    model = DiffusionModelConfig(path=model_path, lora=DiffusionLoraConfig(rank=4, alpha=8, init_lora_weights=False))
    # "default": the engine's own choice (fp32 on CPU, bf16 on a GPU); a precision name: FSDP2 computes in it
    precision = None if compute == "default" else {"param_dtype": compute, "reduce_dtype": "fp32"}
    engine_config = FSDPEngineConfig(
        strategy="fsdp2", seed=7, ulysses_sequence_parallel_size=degree, mixed_precision=precision
    )
    optim = FSDPOptimizerConfig(optimizer="SGD", lr=lr, total_training_steps=1, weight_decay=0.0)
    engine = EngineRegistry.new("diffusion_model", "fsdp2", model, engine_config, optim, CheckpointConfig())
    engine.initialize()
    return engine


def full_batch(name: str, model_path: str, engine, spec) -> dict[str, torch.Tensor]:
    """The same recorded-looking batch on every rank: latents, timesteps of the rollout's schedule, padded prompts."""
    from verl_omni.workers.utils.replay import prepare_scheduler

    transformer = json.loads((Path(model_path) / "transformer" / "config.json").read_text())
    generator = torch.Generator().manual_seed(0)
    cells = engine.vae_scale_factor
    if name.startswith("wan2_2"):
        frames = (spec.num_frames - 1) // engine.adapter.frame_multiple + 1
        shape = (transformer["out_channels"], frames, spec.height // cells, spec.width // cells)
    else:
        shape = ((spec.height // (2 * cells)) * (spec.width // (2 * cells)), transformer["in_channels"])
    latents = torch.randn(SAMPLES, WINDOW + 1, *shape, generator=generator)
    prepare_scheduler(engine.adapter, engine.scheduler, spec, engine.adapter.schedule_seq_len(latents[:, 0]))
    timesteps = engine.scheduler.timesteps[:WINDOW].float().expand(SAMPLES, WINDOW).clone()
    text_dim = transformer[TEXT_DIM_KEYS[name]]
    batch = {"all_latents": latents, "all_timesteps": timesteps, "advantages": torch.tensor([1.0, -0.5, 0.25, -1.0])}
    if "image_condition" in engine.adapter.conditioning_keys:
        # the image-to-video model's first-frame condition: the input channels beyond the latents'
        condition = (transformer["in_channels"] - shape[0], *shape[1:])
        batch["image_condition"] = torch.randn(SAMPLES, *condition, generator=generator)
    if name in FIXED_TEXT_LENGTH:
        for prefix in ("", "negative_"):
            batch[f"{prefix}prompt_embeds"] = torch.randn(
                SAMPLES, FIXED_TEXT_LENGTH[name], text_dim, generator=generator
            )
        return batch
    # prompts of 5 tokens (two rows padded to 3 and 4) and negative prompts of 3: an odd length, masked padding
    for prefix, length, kept in (("", 5, (5, 3, 5, 4)), ("negative_", 3, (3, 3, 2, 3))):
        batch[f"{prefix}prompt_embeds"] = torch.randn(SAMPLES, length, text_dim, generator=generator)
        batch[f"{prefix}prompt_embeds_mask"] = (torch.arange(length) < torch.tensor(kept)[:, None]).long()
    return batch


def advantage_loss(out, micro_batch, step):
    """A loss of every row's log-prob (its mean over the micro-batch's rows), with the metric the actor logs."""
    loss = -(out.log_prob * micro_batch["advantages"]).mean()
    return loss, {"loss": loss.item()}


def replay(engine, local: dict, spec, train: bool) -> dict:
    from verl_omni.workers.engine.fsdp.diffusers_impl import MICRO_BATCH_KEY, SAMPLING_SPEC_KEY

    data = TensorDict({k: v.clone() for k, v in local.items()}, batch_size=[len(local["all_latents"])])
    data.set_non_tensor(SAMPLING_SPEC_KEY, spec)
    data.set_non_tensor(MICRO_BATCH_KEY, 1)
    return engine.forward_backward_batch(data, advantage_loss if train else None, forward_only=not train)


def gather(t: torch.Tensor) -> torch.Tensor:
    """Every rank's rows in rank order, on the host (moved to this rank's GPU for NCCL)."""
    t = t.to("cuda") if dist.get_backend() == "nccl" else t
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts).cpu()


def lora_grads(engine) -> dict[str, torch.Tensor | None]:
    """Every LoRA tensor's gradient, unsharded; None for one the loss does not reach (a last block's text stream)."""
    grads = {}
    for name, param in engine.module.named_parameters():
        if param.requires_grad:
            grads[name] = None if param.grad is None else param.grad.full_tensor().detach().cpu().clone()
    return grads


def result_path(out_dir: str | Path, name: str, compute: str) -> Path:
    """Where a case's numbers go: ``OUT_DIR/MODEL-COMPUTE.pt``."""
    return Path(out_dir) / f"{name}-{compute}.pt"


def run_case(name: str, model_path: str, out_path: Path, compute: str) -> None:
    """One model at one compute precision: degrees 1 and 2, the split checkpoint resumed unsplit; rank 0 writes."""
    from verl_omni.pipelines.sampling import SamplingSpec

    rank, world = dist.get_rank(), dist.get_world_size()
    spec = SamplingSpec(num_inference_steps=4, true_cfg_scale=4.0, sde_window_size=WINDOW, **SIZE[name])
    checkpoint = out_path.with_name(f"{out_path.stem}_ckpt_sp2")
    results: dict = {}
    for degree in (1, 2):
        engine = build_engine(model_path, degree, compute, LEARNING_RATE.get(name, 10.0))
        batch = full_batch(name, model_path, engine, spec)
        local = {k: v.chunk(world)[rank] for k, v in batch.items()}
        results[f"log_probs_{degree}"] = gather(replay(engine, local, spec, train=False)["log_probs"])
        engine.optimizer.zero_grad()
        results[f"train_log_probs_{degree}"] = gather(replay(engine, local, spec, train=True)["log_probs"])
        results[f"grads_{degree}"] = lora_grads(engine)
        if degree == 2:
            engine.optimizer_step()
            results["stepped_log_probs_2"] = gather(replay(engine, local, spec, train=False)["log_probs"])
            engine.save_checkpoint(str(checkpoint), global_step=1)
        del engine
    resumed = build_engine(model_path, 1, compute, LEARNING_RATE.get(name, 10.0))
    resumed.load_checkpoint(str(checkpoint))
    local = {k: v.chunk(world)[rank] for k, v in full_batch(name, model_path, resumed, spec).items()}
    results["resumed_log_probs_1"] = gather(replay(resumed, local, spec, train=False)["log_probs"])
    if rank == 0:
        torch.save(results, out_path)
    dist.barrier()


def main(device: str, out_dir: str, *cases: str) -> None:
    torch.set_num_threads(1)
    if device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if device == "cuda" else "gloo")
    for case in cases:
        name, compute, model_path = case.split(":", 2)
        run_case(name, model_path, result_path(out_dir, name, compute), compute)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])

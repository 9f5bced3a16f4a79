"""Replay of recorded BAGEL rollouts with the training module, shared by the CPU and GPU engine tests."""

import torch


def replay_diff(model_path, outputs, spec, lora=None, autocast=False) -> float:
    """Max |log π_θ − recorded log-prob| over the outputs' recorded steps, replayed on the CPU with the
    fp32 training module (``autocast``: under bf16 autocast, as the rollout computes); ``lora`` is
    called on the module first."""
    from verl_omni.pipelines.bagel.training_adapter import BagelTrainingAdapter
    from verl_omni.workers.utils.replay import check_replay_batch, prepare_scheduler, replay_step

    adapter = BagelTrainingAdapter
    module = adapter.build_module(model_path).eval()
    if lora is not None:
        lora(module)
    batch = {
        k: torch.stack([o.extra_fields[k] for o in outputs]) for k in outputs[0].extra_fields if k != "window_start"
    }
    check_replay_batch(batch, spec, adapter)
    scheduler = adapter.build_scheduler(model_path)
    prepare_scheduler(adapter, scheduler, spec, batch["all_latents"].shape[2])
    recorded = torch.stack([o.rollout_log_probs for o in outputs])
    window = recorded.shape[1]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        replayed = torch.stack(
            [replay_step(adapter, module, scheduler, batch, j, spec).log_prob for j in range(window)], 1
        )
    return float((replayed - recorded).abs().max())

"""Engine start, source images and actor replay of the diffusers-family rollouts (SD3.5, FLUX.1, Z-Image, Wan2.2,
Qwen-Image-Edit), shared by the CPU and GPU engine tests."""

import torch


def start_engine(loop, model_path, dtype: str, size: tuple[int, int], **engine_kwargs):
    """The model's rollout engine, started; it warms up at ``size`` (one step), not at vLLM-Omni's 512²;
    ``engine_kwargs`` go to the engine (``ulysses_degree``...)."""
    from verl_omni.workers.rollout.vllm_omni.engine import OmniRolloutEngine

    rollout = OmniRolloutEngine(str(model_path), dtype=dtype, warmup_size=size, **engine_kwargs)

    async def start():
        rollout.start()

    loop.run(start(), timeout=rollout.engine_start_timeout_s + 60)
    return rollout


def random_lora_module(adapter, model_path):
    """The adapter's training module with one random LoRA (rank 4, alpha 8) on the adapter's default targets, in
    eval mode: what the LoRA-sync tests push to the rollout."""
    from peft import LoraConfig

    module = adapter.build_module(model_path).eval()
    torch.manual_seed(0)
    module.add_adapter(
        LoraConfig(
            r=4,
            lora_alpha=8,
            target_modules=list(adapter.lora_target_modules),
            exclude_modules=adapter.lora_exclude_modules,
            init_lora_weights=False,
        )
    )
    return module


def tokenized_prompt(model_path, adapter, text: str) -> list[int]:
    """``text`` as the adapter's tokenizer gives it to the rollout."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path, subfolder=adapter.tokenizer_subfolder)
    return adapter.prompt_token_ids(tokenizer, text)


def source_image(seed: int = 0, size: tuple[int, int] = (40, 24)):
    """A random RGB source image (not square: its conditioning grid is not the output's)."""
    import numpy as np
    from PIL import Image

    return Image.fromarray(np.random.RandomState(seed).randint(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def source_images(adapter, image=None) -> list | None:
    """An editing model's source images for one request: ``image`` (default :func:`source_image`) and, for a
    multi-image model, a second, square one; ``None`` for a model that takes none."""
    if not adapter.max_source_images:
        return None
    images = [source_image() if image is None else image]
    if adapter.max_source_images > 1:
        images.append(source_image(2, (24, 24)))
    return images


def replay_log_probs(
    adapter, model_path, outputs, params: dict, device: str = "cpu", autocast=None, module=None
) -> torch.Tensor:
    """``[B, W]`` log π_θ of the outputs' recorded steps, replayed with the adapter's diffusers transformer
    (fp32 weights on ``device``, or ``module``, e.g. one with a LoRA; ``autocast``: a dtype to compute in, as a
    bf16 actor does), as the trainer does."""
    from verl_omni.pipelines.sampling import SamplingSpec
    from verl_omni.workers.utils.replay import check_replay_batch, prepare_scheduler, replay_step

    spec, _ = SamplingSpec.from_request_params(params, adapter)
    spec = spec.replay()
    keys = ("all_latents", "all_timesteps", *adapter.required_keys(spec.uses_cfg))
    batch = {k: torch.stack([o.extra_fields[k] for o in outputs]).to(device) for k in keys}
    check_replay_batch(batch, spec, adapter)
    module = (module if module is not None else adapter.build_module(model_path)).to(device).eval()
    scheduler = adapter.build_scheduler(model_path)
    prepare_scheduler(adapter, scheduler, spec, adapter.schedule_seq_len(batch["all_latents"][:, 0]))
    vae_scale = adapter.vae_scale_factor(model_path)
    window = batch["all_timesteps"].shape[1]
    with torch.no_grad(), torch.autocast(device, dtype=autocast or torch.float32, enabled=autocast is not None):
        steps = [replay_step(adapter, module, scheduler, batch, j, spec, vae_scale).log_prob for j in range(window)]
    return torch.stack(steps, dim=1).float().cpu()

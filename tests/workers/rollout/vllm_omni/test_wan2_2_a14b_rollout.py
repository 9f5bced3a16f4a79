"""The two-expert Wan2.2 (A14B layout) on the real engine (CPU platform plugin, tiny random model, fp32).

vLLM-Omni's ``diffuse`` hands the steps with t >= 1000 · boundary_ratio to ``transformer`` and the rest to
``transformer_2``; the replay must use the expert that sampled each recorded step. The windows here are pinned to
steps 1 and 2 (timesteps 937.5 and 833.3 with shift 5 and 4 steps, boundary 875), so every sample's window has one
step of each expert; the tiny experts differ in depth, so replaying with them swapped must fail the bound.

The LoRA sync: one adapter over both experts (the actor's ``WanExperts``) pushed in memory as the trainer pushes it
binds both experts' layers, each expert its own tensors (full names ``transformer.…`` / ``transformer_2.…``), so the
actor replays both the high-noise and the low-noise step of the window with the LoRA (the trainer's sync probe,
``old_log_prob/rollout_diff_max``, compares the same two sides); the checkpoint's PEFT directory serves the same.
"""

from __future__ import annotations

import pytest
import torch
from diffusers_helpers import random_lora_module, replay_log_probs, start_engine, tokenized_prompt

H = W = 32
PARAMS = {
    "height": H,
    "width": W,
    "num_frames": 5,
    "num_inference_steps": 4,
    "noise_level": 0.7,
    "sde_window_size": 2,
    "sde_window_range": [1, 3],
    "true_cfg_scale": 4.0,
    "seed": 7,
}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_path(tiny_model):
    return tiny_model("wan2_2_a14b")


@pytest.fixture(scope="module")
def adapter(tiny_path):
    from verl_omni.pipelines.model_base import get_model_adapter

    return get_model_adapter(tiny_path)


@pytest.fixture(scope="module")
def engine(tiny_path, loop):
    rollout = start_engine(loop, tiny_path, "float32", (H, W))
    yield rollout
    rollout.shutdown()


@pytest.fixture(scope="module")
def prompts(tiny_path, adapter):
    return tokenized_prompt(tiny_path, adapter, "a red cat on a chair"), tokenized_prompt(tiny_path, adapter, "blurry")


def generate(loop, engine, prompts, request_id: str, n: int = 1, lora_request=None):
    prompt, negative = prompts
    return loop.run(engine.engine_call(prompt, PARAMS, request_id, n, negative, lora_request))


@pytest.fixture(scope="module")
def outputs(loop, engine, prompts):
    return generate(loop, engine, prompts, "a14b", n=3)


def test_the_checkpoint_resolves_to_the_two_expert_adapter(adapter, tiny_path):
    from verl_omni.pipelines.wan2_2.training_adapter import Wan22A14BTrainingAdapter

    assert adapter is Wan22A14BTrainingAdapter and adapter.vae_scale_factor(tiny_path) == 8
    assert adapter.latent_multiple == 16


def test_videos_and_windows_cover_both_experts(outputs, adapter):
    for out in outputs:
        assert out.diffusion_output.shape == (5, 3, H, W) and out.diffusion_output.dtype == torch.uint8
        assert out.extra_fields["window_start"] == 1 and bool(torch.isfinite(out.rollout_log_probs).all())
        assert adapter.high_noise(out.extra_fields["all_timesteps"]).tolist() == [True, False]


def test_each_step_is_replayed_by_the_expert_that_sampled_it(outputs, adapter, tiny_path):
    from verl_omni.pipelines.wan2_2.experts import WanExperts

    rollout = torch.stack([o.rollout_log_probs for o in outputs])
    module = adapter.build_module(tiny_path).eval()
    diff = float((replay_log_probs(adapter, tiny_path, outputs, PARAMS, module=module) - rollout).abs().max())
    print(f"wan2_2_a14b: rollout vs actor replay max |log_prob diff| = {diff:.3e}")
    assert diff <= 1e-5
    swapped = WanExperts(module.transformer_2, module.transformer)
    wrong = (replay_log_probs(adapter, tiny_path, outputs, PARAMS, module=swapped) - rollout).abs()
    print(f"wan2_2_a14b: with the experts swapped, max |log_prob diff| = {float(wrong.max()):.3e}")
    # both columns fail: the high-noise step and the low-noise step each go to the wrong expert
    assert bool((wrong.max(dim=0).values > 1e-3).all())


# per block the self-attention's fused to_qkv and to_out, the cross-attention's to_q, to_k, to_v, to_out: 6 layers;
# the tiny transformer has 2 blocks, transformer_2 1
LORA_LAYERS = {"transformer": 2 * 6, "transformer_2": 1 * 6}


@pytest.fixture(scope="module")
def lora_module(adapter, tiny_path):
    """The actor's module (both experts) with one random LoRA (rank 4, alpha 8) on the adapter's targets."""
    return random_lora_module(adapter, tiny_path)


@pytest.fixture(scope="module")
def synced(loop, engine, prompts, adapter, lora_module):
    """The base sample, 2 samples with ``lora_module``'s LoRA pushed in memory as the trainer pushes it (the engine's
    ``get_per_tensor_param``: the gathered LoRA in the adapter's rollout form), then the base again after removal."""
    from verl_omni.workers.engine.fsdp.checkpoint import ADAPTER_NAME, gather_lora_state_dict

    (base,) = generate(loop, engine, prompts, "lora-base")
    lora = gather_lora_state_dict(lora_module)
    config, tensors = adapter.rollout_lora(lora, lora_module.peft_config[ADAPTER_NAME].to_dict())
    try:
        bound = loop.run(engine.load_lora_tensors(config, tensors))
        adapted = generate(loop, engine, prompts, "lora-on", n=2)
    finally:
        loop.run(engine.clear_lora())
    (restored,) = generate(loop, engine, prompts, "lora-removed")
    return {"base": base, "bound": bound, "adapted": adapted, "restored": restored, "lora": lora}


def test_lora_sync_reaches_both_experts_and_the_actor_replays_both_sides_of_the_boundary(
    adapter, tiny_path, lora_module, synced
):
    """Both experts' layers bind; the actor with the LoRA reproduces the rollout's log-probs on the high-noise and
    the low-noise step; without it (or with the experts' LoRAs exchanged) both steps fail: each expert of the rollout
    applied its own LoRA. Removal restores the base bit for bit."""
    from verl_omni.pipelines.wan2_2.training_adapter import EXPERTS

    bound = synced["bound"]
    for expert in EXPERTS:
        assert sum(name.startswith(f"{expert}.blocks.") for name in bound) == LORA_LAYERS[expert], bound
    assert len(bound) == sum(LORA_LAYERS.values()), bound
    adapted = synced["adapted"]
    for out in adapted:
        assert adapter.high_noise(out.extra_fields["all_timesteps"]).tolist() == [True, False]
        assert not torch.equal(out.diffusion_output, synced["base"].diffusion_output)
    rollout = torch.stack([o.rollout_log_probs for o in adapted])
    diff = (replay_log_probs(adapter, tiny_path, adapted, PARAMS, module=lora_module) - rollout).abs()
    print(f"wan2_2_a14b: with the synced LoRA, rollout vs actor replay max |log_prob diff| per step = {diff.amax(0)}")
    assert float(diff.max()) <= 1e-5
    lora_module.disable_adapters()
    try:
        base = (replay_log_probs(adapter, tiny_path, adapted, PARAMS, module=lora_module) - rollout).abs()
    finally:
        lora_module.enable_adapters()
    print(f"wan2_2_a14b: the same replayed without the LoRA, per step = {base.amax(0)}")
    assert bool((base.amax(0) > 1e-3).all())
    assert torch.equal(synced["restored"].diffusion_output, synced["base"].diffusion_output)
    assert torch.equal(synced["restored"].rollout_log_probs, synced["base"].rollout_log_probs)


def test_checkpoint_lora_directory_served_from_file_equals_the_synced_lora(
    loop, engine, prompts, adapter, lora_module, synced, tmp_path
):
    """The checkpoint's PEFT directory (both experts' tensors under their full names), loaded by vLLM-Omni's LoRA
    manager from disk, gives the in-memory sync's samples bit for bit."""
    from vllm.lora.request import LoRARequest

    from verl_omni.workers.engine.fsdp.checkpoint import ADAPTER_NAME, save_lora_dir

    save_lora_dir(adapter, tmp_path / "lora", synced["lora"], lora_module.peft_config[ADAPTER_NAME].to_dict())
    request = LoRARequest(lora_name="ckpt", lora_int_id=10_000, lora_path=str(tmp_path / "lora"))
    served = generate(loop, engine, prompts, "lora-file", n=2, lora_request=request)
    for a, b in zip(served, synced["adapted"], strict=True):
        assert torch.equal(a.diffusion_output, b.diffusion_output)
        assert torch.equal(a.rollout_log_probs, b.rollout_log_probs)

"""BAGEL on the real vLLM-Omni engine (CPU platform, tiny random BAGEL), single-stage: the DiT stage prefills
the prompt itself. One engine for the module.

The thinker + DiT deploy needs vLLM's compiled AR engine (``vllm._C``), absent from the CPU install:
``test_bagel_rollout_engine_gpu.py`` covers it.
"""

import pytest
import torch
from bagel_helpers import replay_diff

from verl_omni.pipelines.sampling import SamplingSpec

H = W = 32
STEPS = 4
WINDOW = 2
NOISE = 0.7
CFG = 4.0
SAMPLING = {
    "height": H,
    "width": W,
    "num_inference_steps": STEPS,
    "true_cfg_scale": CFG,
    "noise_level": NOISE,
    "sde_window_size": WINDOW,
    "seed": 5,
}
# max |Δ log-prob| rollout (bf16 engine) vs replay (fp32 module): measured 6.2e-4 (8.5e-4 under bf16 autocast)
REPLAY_BOUND = 2e-3

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bagel_prompts(tiny_bagel_path):
    from transformers import AutoTokenizer

    from verl_omni.pipelines.bagel.training_adapter import prompt_token_ids

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_bagel_path))
    return {"cat": prompt_token_ids(tokenizer, "a red cat on a chair"), "negative": []}


def generate(loop, engine, prompts, n=1, request_id="req", **overrides):
    params = {**SAMPLING, **overrides}
    return loop.run(
        engine.engine_call(
            prompts["cat"], params, request_id, num_outputs_per_prompt=n, negative_prompt_token_ids=prompts["negative"]
        )
    )


@pytest.fixture(scope="module")
def recorded(loop, bagel_engine, bagel_prompts):
    """Two samples of one prompt (the base policy), shared by the tests below."""
    return generate(loop, bagel_engine, bagel_prompts, n=2, request_id="recorded")


def test_generate_returns_images_log_probs_and_the_trajectory_per_sample(recorded, bagel_prompts):
    assert len(recorded) == 2
    for out in recorded:
        assert out.diffusion_output.dtype == torch.uint8 and out.diffusion_output.shape == (3, H, W)
        assert out.rollout_log_probs.shape == (WINDOW,) and bool(torch.isfinite(out.rollout_log_probs).all())
        extra = out.extra_fields
        # packed latent tokens: (H/16)·(W/16) tokens of 2·2·16 channels
        assert extra["all_latents"].shape == (WINDOW + 1, (H // 16) * (W // 16), 64)
        assert extra["all_timesteps"].shape == (WINDOW,)
        assert bool((extra["all_timesteps"][1:] < extra["all_timesteps"][:-1]).all())
        assert extra["prompt_token_ids"].tolist() == bagel_prompts["cat"]
        assert extra["negative_prompt_token_ids"].numel() == 0
    assert not torch.equal(recorded[0].diffusion_output, recorded[1].diffusion_output)


def test_same_seed_reproduces_the_sample(loop, bagel_engine, bagel_prompts, recorded):
    (again,) = generate(loop, bagel_engine, bagel_prompts, request_id="again")
    assert torch.equal(again.diffusion_output, recorded[0].diffusion_output)
    assert torch.equal(again.rollout_log_probs, recorded[0].rollout_log_probs)


def _replay(model_path, outputs, lora=None, autocast=False) -> float:
    return replay_diff(
        model_path,
        outputs,
        SamplingSpec(
            num_inference_steps=STEPS, height=H, width=W, noise_level=NOISE, sde_type="sde", true_cfg_scale=CFG
        ),
        lora=lora,
        autocast=autocast,
    )


def test_replay_reproduces_rollout_log_probs(recorded, tiny_bagel_path):
    diff = _replay(tiny_bagel_path, recorded)
    diff_autocast = _replay(tiny_bagel_path, recorded, autocast=True)
    print(
        f"BAGEL rollout (bf16 engine) vs training-module replay: max |log-prob diff| fp32 {diff:.3e}, bf16 autocast {diff_autocast:.3e}"
    )
    assert diff <= REPLAY_BOUND
    assert diff_autocast <= REPLAY_BOUND


def test_lora_binds_to_the_generation_expert_changes_the_image_and_replays(
    loop, bagel_engine, bagel_prompts, recorded, tiny_bagel_path
):
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    from verl_omni.pipelines.bagel.training_adapter import BagelTrainingAdapter as adapter

    def inject(module, zero=False):
        torch.manual_seed(0)
        module.add_adapter(
            LoraConfig(r=4, lora_alpha=4, target_modules=list(adapter.lora_target_modules), init_lora_weights=False)
        )
        if zero:
            for name, param in module.named_parameters():
                if "lora_B" in name:
                    param.data.zero_()
        return module

    def export(zero=False):
        module = inject(adapter.build_module(tiny_bagel_path), zero)
        tensors = get_peft_model_state_dict(module)
        return adapter.rollout_lora(tensors, module.peft_config["default"].to_dict())

    try:
        bound = loop.run(bagel_engine.load_lora_tensors(*export()))
        # gate/up (fused) and down of the generation expert in both layers
        assert len(bound) == 4, bound
        adapted = generate(loop, bagel_engine, bagel_prompts, n=2, request_id="lora-on")
        assert not torch.equal(adapted[0].diffusion_output, recorded[0].diffusion_output)
        diff = _replay(tiny_bagel_path, adapted, lora=inject)
        print(f"with LoRA: max |log-prob diff| rollout vs replay = {diff:.3e}")
        assert diff <= REPLAY_BOUND

        loop.run(bagel_engine.load_lora_tensors(*export(zero=True)))
        (restored,) = generate(loop, bagel_engine, bagel_prompts, request_id="lora-zero")
        assert torch.equal(restored.diffusion_output, recorded[0].diffusion_output)
    finally:
        loop.run(bagel_engine.clear_lora())


def test_ode_request_returns_the_image_and_an_empty_window(loop, bagel_engine, bagel_prompts):
    """Validation samples the ODE (noise level 0): nothing is recorded, W = 0."""
    (out,) = generate(loop, bagel_engine, bagel_prompts, request_id="ode", noise_level=0.0)
    assert out.diffusion_output.shape == (3, H, W)
    assert out.rollout_log_probs.shape == (0,)
    assert out.extra_fields["all_latents"].shape == (0, (H // 16) * (W // 16), 64)

"""BAGEL thinker + DiT on the real vLLM-Omni engine (CUDA, tiny random BAGEL in bf16), one engine for the module.

The thinker stage (vLLM's AR engine) prefills the prompt and hands its KV cache to the DiT stage,
which runs our log-prob pipeline. Without ``deploy_config`` vLLM-Omni picks BAGEL's default
two-stage deploy (``vllm_omni/deploy/bagel.yaml``).
"""

import asyncio

import pytest
import torch
from bagel_helpers import replay_diff
from figures import figure

from verl_omni.pipelines.sampling import SamplingSpec

H = W = 64
STEPS = 4
WINDOW = 2
SAMPLING = {
    "height": H,
    "width": W,
    "num_inference_steps": STEPS,
    "true_cfg_scale": 4.0,
    "noise_level": 0.7,
    "sde_window_size": WINDOW,
    "seed": 11,
}
# max |Δ log-prob| thinker + DiT rollout (bf16) vs the training module's replay (fp32, its own
# understanding-expert prefill of the same token ids); the DiT-only path on CPU measures 6.2e-4
REPLAY_BOUND = 2e-3

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


@pytest.fixture(scope="module")
def ids(tiny_bagel_bf16_path):
    from transformers import AutoTokenizer

    from verl_omni.pipelines.bagel.training_adapter import prompt_token_ids

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_bagel_bf16_path))
    return prompt_token_ids(tokenizer, "a red cat on a chair")


def generate(loop, engine, ids, request_id, n=1, **overrides):
    return loop.run(engine.engine_call(ids, {**SAMPLING, **overrides}, request_id, num_outputs_per_prompt=n))


def test_thinker_dit_generates_an_image(loop, thinker_dit_engine, ids):
    (out,) = generate(loop, thinker_dit_engine, ids, "gpu-gen")
    assert out.diffusion_output.dtype == torch.uint8 and out.diffusion_output.shape == (3, H, W)
    assert int(out.diffusion_output.max()) > int(out.diffusion_output.min())


def test_thinker_dit_generates_with_log_probs_per_sample(loop, thinker_dit_engine, ids):
    outs = generate(loop, thinker_dit_engine, ids, "gpu-logprobs", n=2)
    assert len(outs) == 2
    for out in outs:
        assert out.rollout_log_probs.shape == (WINDOW,) and bool(torch.isfinite(out.rollout_log_probs).all())
        assert out.extra_fields["all_latents"].shape[0] == WINDOW + 1
        assert out.extra_fields["all_timesteps"].shape == (WINDOW,)
    assert not torch.equal(outs[0].diffusion_output, outs[1].diffusion_output)


def test_thinker_dit_rollout_replays_with_the_training_module(loop, thinker_dit_engine, ids, tiny_bagel_bf16_path):
    # the DiT stage conditions on the thinker's KV cache; the training module prefills the same ids itself:
    # a different position, mask or prompt layout on either side shows here as a log-prob gap
    # with the empty negative context the agent loop sends for BAGEL (true CFG)
    outs = loop.run(
        thinker_dit_engine.engine_call(
            ids, SAMPLING, "gpu-replay", num_outputs_per_prompt=2, negative_prompt_token_ids=[]
        )
    )
    spec = SamplingSpec(
        num_inference_steps=STEPS,
        height=H,
        width=W,
        noise_level=SAMPLING["noise_level"],
        sde_type="sde",
        true_cfg_scale=SAMPLING["true_cfg_scale"],
    )
    diff = replay_diff(tiny_bagel_bf16_path, outs, spec)
    # BAGEL thinker + DiT rollout vs the training module's replay
    figure("logprob_diff_rollout_vs_replay", diff)
    assert diff <= REPLAY_BOUND


def test_concurrent_requests_each_get_their_own_sample(loop, thinker_dit_engine, ids):
    async def many():
        calls = [
            thinker_dit_engine.engine_call(ids, {**SAMPLING, "seed": 100 + i}, f"gpu-concurrent-{i}") for i in range(4)
        ]
        return await asyncio.gather(*calls)

    outs = [o for (o,) in loop.run(many())]
    images = [o.diffusion_output for o in outs]
    assert all(not torch.equal(images[i], images[j]) for i in range(4) for j in range(i + 1, 4))
    (again,) = generate(loop, thinker_dit_engine, ids, "gpu-concurrent-again", seed=100)
    assert torch.equal(again.diffusion_output, images[0])


def test_lora_on_the_generation_expert_changes_the_image_and_zero_restores_it(
    loop, thinker_dit_engine, ids, tiny_bagel_bf16_path
):
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    from verl_omni.pipelines.bagel.training_adapter import BagelTrainingAdapter as adapter

    def export(zero: bool):
        module = adapter.build_module(tiny_bagel_bf16_path)
        torch.manual_seed(0)
        module.add_adapter(
            LoraConfig(r=4, lora_alpha=4, target_modules=list(adapter.lora_target_modules), init_lora_weights=False)
        )
        tensors = get_peft_model_state_dict(module)
        if zero:
            tensors = {k: v.zero_() if "lora_B" in k else v for k, v in tensors.items()}
        return adapter.rollout_lora(tensors, module.peft_config["default"].to_dict())

    (base,) = generate(loop, thinker_dit_engine, ids, "gpu-lora-base")
    try:
        assert len(loop.run(thinker_dit_engine.load_lora_tensors(*export(zero=False)))) == 4
        (adapted,) = generate(loop, thinker_dit_engine, ids, "gpu-lora-on")
        assert not torch.equal(adapted.diffusion_output, base.diffusion_output)
        loop.run(thinker_dit_engine.load_lora_tensors(*export(zero=True)))
        (restored,) = generate(loop, thinker_dit_engine, ids, "gpu-lora-zero")
        assert torch.equal(restored.diffusion_output, base.diffusion_output)
    finally:
        loop.run(thinker_dit_engine.clear_lora())

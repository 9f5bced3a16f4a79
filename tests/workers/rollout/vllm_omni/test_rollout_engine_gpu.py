"""The log-prob rollout on CUDA: vLLM-Omni in bf16 with our pipeline, worker extension and tensor LoRA."""

import pytest
import torch

pytestmark = pytest.mark.gpu

SAMPLING = {
    "height": 64,
    "width": 64,
    "num_inference_steps": 6,
    "true_cfg_scale": 4.0,
    "noise_level": 0.7,
    "sde_window_size": 2,
    "seed": 3,
}


@pytest.fixture(scope="module")
def ids(tiny_qwen_image_bf16_path):
    from transformers import Qwen2Tokenizer

    from verl_omni.pipelines.qwen_image.rollout_request import prompt_token_ids

    tok = Qwen2Tokenizer.from_pretrained(tiny_qwen_image_bf16_path, subfolder="tokenizer")
    return prompt_token_ids(tok, "a red cat on a chair"), prompt_token_ids(tok, " ")


def test_generate_batched_on_cuda_records_finite_log_probs(loop, bf16_engine, ids):
    prompt, negative = ids
    outs = loop.run(
        bf16_engine.engine_call(prompt, SAMPLING, "gpu-4", num_outputs_per_prompt=4, negative_prompt_token_ids=negative)
    )
    assert len(outs) == 4
    lp = torch.stack([o.rollout_log_probs for o in outs])
    print(f"cuda bf16 rollout: log_probs {lp.tolist()}")
    assert lp.shape == (4, 2) and bool(torch.isfinite(lp).all())
    assert all(o.diffusion_output.shape == (3, 64, 64) and o.diffusion_output.dtype == torch.uint8 for o in outs)
    assert not torch.equal(outs[0].diffusion_output, outs[1].diffusion_output)
    assert outs[0].extra_fields["all_latents"].shape[0] == 3


# pixel levels a zero LoRA may differ from no LoRA on CUDA: bf16 rounding of recompiled kernels (test below)
ZERO_LORA_PIXEL_BOUND = 2


def test_tensor_lora_on_cuda_changes_the_image_and_zeros_restore_it(loop, bf16_engine, ids):
    prompt, negative = ids

    def one(request_id):
        (out,) = loop.run(bf16_engine.engine_call(prompt, SAMPLING, request_id, negative_prompt_token_ids=negative))
        return out.diffusion_output

    def lora(scale):
        gen = torch.Generator().manual_seed(0)
        tensors = {}
        for block in range(2):
            for proj in ("to_q", "to_k", "to_v"):
                prefix = f"base_model.model.transformer_blocks.{block}.attn.{proj}"
                tensors[f"{prefix}.lora_A.weight"] = torch.randn(4, 64, generator=gen) * 0.5
                tensors[f"{prefix}.lora_B.weight"] = torch.randn(64, 4, generator=gen) * scale
        return {"r": 4, "lora_alpha": 4, "target_modules": ["to_q", "to_k", "to_v"]}, tensors

    base = one("lora-base")
    # the same request twice without a LoRA: the engine itself reproduces the image bit for bit
    assert torch.equal(one("lora-base-again"), base)
    assert len(loop.run(bf16_engine.load_lora_tensors(*lora(2.0)))) > 0
    lora_diff = (one("lora-on").int() - base.int()).abs().max().item()
    loop.run(bf16_engine.load_lora_tensors(*lora(0.0)))
    zero = one("lora-zero")
    zero_diff = (zero.int() - base.int()).abs().max().item()
    print(f"max |pixel diff| vs no LoRA: LoRA {lora_diff}, zero LoRA {zero_diff}")
    # A LoRA recompiles the transformer (torch.compile) and inductor's autotuning may pick other bf16 GEMM kernels
    # for the new graph: their rounding moved a pixel by 2 levels on an H100 (2026-11-24; 0 on another call). A
    # zero LoRA restores the base within that rounding; a LoRA still bound would move it like the LoRA does.
    assert lora_diff > 8 and zero_diff <= ZERO_LORA_PIXEL_BOUND

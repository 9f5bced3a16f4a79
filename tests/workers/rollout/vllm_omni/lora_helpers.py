"""The seeded PEFT-named LoRA the Qwen-Image engine tests push, shared by the CPU, GPU and Ray server tests."""

import torch


def attention_lora(
    scale: float, a_scale: float = 0.5, seed: int = 0, num_layers: int = 2, inner_dim: int = 64, rank: int = 4
) -> tuple[dict, dict[str, torch.Tensor]]:
    """``(peft_config, tensors)``: a random rank-``rank`` LoRA on the image-stream q/k/v projections of the tiny
    transformer's blocks (fused into ``to_qkv`` by vLLM-Omni), A scaled by ``a_scale``, B by ``scale`` (0: an adapter
    that changes nothing)."""
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(num_layers):
        for proj in ("to_q", "to_k", "to_v"):
            prefix = f"base_model.model.transformer_blocks.{layer}.attn.{proj}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, inner_dim, generator=gen) * a_scale
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(inner_dim, rank, generator=gen) * scale
    return {"r": rank, "lora_alpha": rank, "target_modules": ["to_q", "to_k", "to_v"]}, tensors

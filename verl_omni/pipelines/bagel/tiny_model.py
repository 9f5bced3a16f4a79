"""Tiny random BAGEL in the layout of the released checkpoint (``ByteDance-Seed/BAGEL-7B-MoT``).

The directory holds ``config.json`` (``model_type: bagel``), ``llm_config.json``,
``vit_config.json``, the Qwen2 tokenizer files, the SigLIP ``preprocessor_config.json``,
``ema.safetensors`` (LLM with both experts, timestep embedder, ``vae2llm``/``llm2vae``,
latent/ViT position tables, ViT, connector) and ``ae.safetensors`` (the VAE). vLLM-Omni's
``BagelPipeline`` and the training module :class:`~verl_omni.pipelines.bagel.modeling.BagelForGeneration`
load it through the same code as the real model.

The LLM, ViT and position tables are tiny. The VAE is not: vLLM-Omni builds BAGEL's VAE with fixed
hyper-parameters (the FLUX autoencoder, 84M parameters), so ``ae.safetensors`` has the real VAE's
shapes with random weights (~330 MB in fp32, half in bf16).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import torch

from verl_omni.utils.tiny_models.tokenizer import build_qwen2_tokenizer

logger = logging.getLogger(__name__)

HIDDEN = 64
MAX_LATENT_SIZE = 8  # latent tokens per image side: images up to 8 * 16 = 128 pixels
VIT_HIDDEN = 32
VIT_PATCH = 14
VIT_MAX_PATCHES_PER_SIDE = 4
# vLLM-Omni's BAGEL thinker marks an image to edit with Qwen2's FIM token
BAGEL_IMG2IMG_TOKEN = "<|fim_middle|>"


def _llm_config(vocab_size: int, tokenizer) -> dict:
    ids = tokenizer.convert_tokens_to_ids
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": HIDDEN,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,  # as the released BAGEL; vLLM profiles the thinker up to it
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "vocab_size": vocab_size,
        "bos_token_id": ids("<|im_start|>"),
        "eos_token_id": ids("<|im_end|>"),
        "pad_token_id": ids("<|endoftext|>"),
        "qk_norm": True,
        "layer_module": "Qwen2MoTDecoderLayer",
    }


def _vit_config() -> dict:
    return {
        "model_type": "siglip_vision_model",
        "hidden_size": VIT_HIDDEN,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_channels": 3,
        "image_size": VIT_PATCH * VIT_MAX_PATCHES_PER_SIDE,
        "patch_size": VIT_PATCH,
        "hidden_act": "gelu_pytorch_tanh",
        "layer_norm_eps": 1e-6,
        "vision_use_head": False,
    }


def sincos_table(side: int, dim: int) -> torch.Tensor:
    """A ``[side², dim]`` 2-D sin-cos position table (half the channels per axis), as BAGEL stores its tables."""

    def axis(pos: np.ndarray, d: int) -> np.ndarray:
        omega = 1.0 / 10000 ** (np.arange(d // 2, dtype=np.float64) / (d / 2.0))
        out = np.einsum("m,d->md", pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    rows, cols = np.meshgrid(np.arange(side, dtype=np.float64), np.arange(side, dtype=np.float64), indexing="ij")
    return torch.from_numpy(np.concatenate([axis(rows, dim // 2), axis(cols, dim // 2)], axis=1)).float()


def _understanding_weights(seed: int) -> dict[str, torch.Tensor]:
    """ViT, connector and ViT position table (understanding only; the generation path does not use them)."""
    from torch import nn
    from transformers import SiglipVisionConfig, SiglipVisionModel

    torch.manual_seed(seed + 1)
    vit = SiglipVisionModel(SiglipVisionConfig(**_vit_config()))
    # checkpoint names are ``vit_model.vision_model.*`` whatever transformers' wrapper prefixes are
    weights = {f"vit_model.vision_model.{k}": v for k, v in getattr(vit, "vision_model", vit).state_dict().items()}
    for name, (n_in, n_out) in {"fc1": (VIT_HIDDEN, HIDDEN), "fc2": (HIDDEN, HIDDEN)}.items():
        layer = nn.Linear(n_in, n_out)
        weights[f"connector.{name}.weight"], weights[f"connector.{name}.bias"] = layer.weight.data, layer.bias.data
    weights["vit_pos_embed.pos_embed"] = sincos_table(VIT_MAX_PATCHES_PER_SIDE, HIDDEN)
    return weights


def _generation_weights(model_dir: Path, seed: int) -> dict[str, torch.Tensor]:
    """The LLM (both experts), timestep embedder, vae2llm/llm2vae and the latent table, random but not degenerate."""
    from torch import nn

    from verl_omni.pipelines.bagel.modeling import BagelConfig, BagelForGeneration

    torch.manual_seed(seed)
    model = BagelForGeneration(BagelConfig.from_pretrained(model_dir))
    for name, param in model.named_parameters():
        if name.endswith("norm.weight") or "norm_moe_gen" in name or "_norm" in name:
            nn.init.normal_(param, mean=1.0, std=0.1)
        elif param.ndim == 2:
            nn.init.normal_(param, std=0.08)
        else:
            nn.init.normal_(param, std=0.02)
    model.latent_pos_embed.pos_embed.data.copy_(sincos_table(MAX_LATENT_SIZE, HIDDEN))
    weights = dict(model.state_dict())
    weights["language_model.lm_head.weight"] = torch.randn(model.config.vocab_size, HIDDEN) * 0.02
    return weights


def _vae_weights(seed: int) -> dict[str, torch.Tensor]:
    from vllm_omni.diffusion.models.bagel.autoencoder import AutoEncoder
    from vllm_omni.diffusion.models.bagel.pipeline_bagel import default_ae_params

    torch.manual_seed(seed + 2)
    return dict(AutoEncoder(default_ae_params()).state_dict())


def _save(weights: dict[str, torch.Tensor], path: Path, dtype: str) -> None:
    from safetensors.torch import save_file

    save_file({k: v.detach().to(getattr(torch, dtype)).contiguous() for k, v in weights.items()}, str(path))


def build_tiny_bagel(out_dir: Path, seed: int = 0, dtype: str = "float32") -> Path:
    """Write a tiny random BAGEL to ``out_dir``; the same seed gives the same weights.

    Args:
        out_dir: target directory (created; existing files are overwritten).
        seed: seeds every component's random init.
        dtype: dtype the weights are saved in.

    Returns:
        ``out_dir``, loadable by vLLM-Omni (``BagelPipeline``) and by ``BagelForGeneration.from_pretrained``.
    """
    from transformers import SiglipImageProcessor

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_qwen2_tokenizer()
    # the thinker profiles its image-editing input at start-up: the real tokenizer has the token
    tokenizer.add_tokens([BAGEL_IMG2IMG_TOKEN], special_tokens=True)
    tokenizer.save_pretrained(out_dir)
    side = VIT_PATCH * VIT_MAX_PATCHES_PER_SIDE
    SiglipImageProcessor(size={"height": side, "width": side}).save_pretrained(out_dir)
    llm, vit = _llm_config(len(tokenizer), tokenizer), _vit_config()
    config = {
        "architectures": ["BagelForConditionalGeneration"],
        "model_type": "bagel",
        "llm_config": llm,
        "vit_config": vit,
        "vae_config": {"z_channels": 16, "downsample": 8},
        "latent_patch_size": 2,
        "max_latent_size": MAX_LATENT_SIZE,
        "vit_max_num_patch_per_side": VIT_MAX_PATCHES_PER_SIDE,
        "connector_act": "gelu_pytorch_tanh",
        "interpolate_pos": False,
        "timestep_shift": 1.0,
        "torch_dtype": dtype,
    }
    for name, content in (("config.json", config), ("llm_config.json", llm), ("vit_config.json", vit)):
        (out_dir / name).write_text(json.dumps(content, indent=2))
    _save(_generation_weights(out_dir, seed) | _understanding_weights(seed), out_dir / "ema.safetensors", dtype)
    _save(_vae_weights(seed), out_dir / "ae.safetensors", dtype)
    logger.info("tiny BAGEL written to %s", out_dir)
    return out_dir

"""Full-size Qwen-Image (-Edit), SD3.5 Medium, FLUX.2 (dev, klein 4B), Wan2.2 (TI2V-5B, T2V-A14B, I2V-A14B),
HunyuanVideo-1.5 and LTX-2, random weights, no weight file.

FLOPs do not depend on the weights, and writing the 20 B transformer (~40 GB in bf16) to disk
would cost minutes on every GPU machine. So the benchmark directory holds the transformer's
``config.json`` only, and the engine's pipelines fill the weights in place on the device instead
of reading them (``load_weights`` never touches the weight iterator). The text side (tokenizer,
text encoder) is the tiny model's: it is not what is timed, and the transformer's
``joint_attention_dim`` is set to its hidden size. The VAE is the full-size architecture with
random weights (~0.25 GB, written once).

The pipelines that fill the weights are in ``random_pipelines.py``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

# stabilityai/stable-diffusion-3.5-medium transformer/config.json: the MMDiT-X of 24 blocks, 24 heads of 64,
# dual attention in blocks 0-12, RMS q/k norm (joint_attention_dim 4096 and pooled 2048 are the released text
# widths; the random benchmark directory swaps in the tiny text encoders' widths)
SD35_MEDIUM_TRANSFORMER = {
    "sample_size": 128,
    "patch_size": 2,
    "in_channels": 16,
    "out_channels": 16,
    "num_layers": 24,
    "attention_head_dim": 64,
    "num_attention_heads": 24,
    "joint_attention_dim": 4096,
    "caption_projection_dim": 1536,
    "pooled_projection_dim": 2048,
    "pos_embed_max_size": 384,
    "dual_attention_layers": tuple(range(13)),
    "qk_norm": "rms_norm",
}
# its vae/config.json: SD3's 16-channel KL autoencoder (8x), no quant convs
SD3_VAE = {
    "block_out_channels": (128, 256, 512, 512),
    "down_block_types": ("DownEncoderBlock2D",) * 4,
    "up_block_types": ("UpDecoderBlock2D",) * 4,
    "layers_per_block": 2,
    "latent_channels": 16,
    "sample_size": 1024,
    "scaling_factor": 1.5305,
    "shift_factor": 0.0609,
    "use_quant_conv": False,
    "use_post_quant_conv": False,
}

# Wan2.2 TI2V-5B's transformer (Wan-AI/Wan2.2-TI2V-5B-Diffusers transformer/config.json; the same numbers as the
# authors' wan/configs/wan_ti2v_5B.py in github.com/Wan-AI/Wan2.2: dim 3072 = 24 heads of 128, ffn 14336, 30 layers,
# 48 latent channels in and out, UMT5-XXL's text width 4096, freq_dim 256, q/k RMS norm, cross-attention norm)
WAN22_TI2V_5B_TRANSFORMER = {
    "patch_size": (1, 2, 2),
    "num_attention_heads": 24,
    "attention_head_dim": 128,
    "in_channels": 48,
    "out_channels": 48,
    "text_dim": 4096,
    "freq_dim": 256,
    "ffn_dim": 14336,
    "num_layers": 30,
    "cross_attn_norm": True,
    "qk_norm": "rms_norm_across_heads",
    "eps": 1e-6,
    "rope_max_seq_len": 1024,
}
# Wan2.2 T2V-A14B's experts, each the same 14 B transformer (the authors' wan/configs/wan_t2v_A14B.py: dim 5120 = 40
# heads of 128, ffn 13824, 40 layers, 16 latent channels in and out (Wan2.1's VAE), freq_dim 256, q/k RMS norm,
# cross-attention norm, eps 1e-6; diffusers' scripts/convert_wan_to_diffusers.py "Wan-T2V-14B" config and
# ``WanTransformer3DModel``'s defaults are the same numbers)
WAN22_T2V_A14B_TRANSFORMER = {
    **WAN22_TI2V_5B_TRANSFORMER,
    "num_attention_heads": 40,
    "in_channels": 16,
    "out_channels": 16,
    "ffn_dim": 13824,
    "num_layers": 40,
}
# Wan2.2 I2V-A14B's experts: the T2V-A14B transformer taking 36 channels in (16 noisy latent channels, then the
# source image's 4 mask and 16 latent channels; the authors' wan/configs/wan_i2v_A14B.py), no image embedder
WAN22_I2V_A14B_TRANSFORMER = {**WAN22_T2V_A14B_TRANSFORMER, "in_channels": 36}
# the full-size transformer config of each Wan builder and the components it fills
WAN_FULL_SIZE = {
    "wan2_2": (WAN22_TI2V_5B_TRANSFORMER, ("transformer",)),
    "wan2_2_a14b": (WAN22_T2V_A14B_TRANSFORMER, ("transformer", "transformer_2")),
    "wan2_2_i2v_a14b": (WAN22_I2V_A14B_TRANSFORMER, ("transformer", "transformer_2")),
}
# FLUX.2-klein 4B's transformer (black-forest-labs/FLUX.2-klein-4B): 5 double-stream and 20 single-stream blocks,
# 24 heads of 128, 128 packed latent channels, MLP ratio 3, no guidance embedding; its text width 7680 is three
# stacked hidden states of Qwen3-4B (2560 each). diffusers' ``Flux2Transformer2DModel`` defaults are FLUX.2-dev's.
FLUX2_KLEIN_4B_TRANSFORMER = {
    "patch_size": 1,
    "in_channels": 128,
    "num_layers": 5,
    "num_single_layers": 20,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 7680,
    "mlp_ratio": 3.0,
    "axes_dims_rope": (32, 32, 32, 32),
    "guidance_embeds": False,
}
# FLUX.2-dev's transformer (black-forest-labs/FLUX.2-dev transformer/config.json; diffusers'
# ``Flux2Transformer2DModel`` defaults are the same): 8 double-stream and 48 single-stream blocks, 48 heads of 128
# (6144 wide), 128 packed latent channels, MLP ratio 3, the guidance embedding; its text width 15360 is three stacked
# hidden states of Mistral Small 3 (5120 each)
FLUX2_DEV_TRANSFORMER = {
    "patch_size": 1,
    "in_channels": 128,
    "num_layers": 8,
    "num_single_layers": 48,
    "attention_head_dim": 128,
    "num_attention_heads": 48,
    "joint_attention_dim": 15360,
    "timestep_guidance_channels": 256,
    "mlp_ratio": 3.0,
    "axes_dims_rope": (32, 32, 32, 32),
    "rope_theta": 2000,
    "eps": 1e-6,
    "guidance_embeds": True,
}
# HunyuanVideo-1.5 480p text-to-video's transformer (hunyuanvideo-community/HunyuanVideo-1.5-480p_t2v
# transformer/config.json; diffusers' ``HunyuanVideo15Transformer3DModel`` defaults are the same numbers): 54
# dual-stream blocks of 16 heads of 128, MLP ratio 4, 1x1x1 patches, 65 channels in (32 noisy latent, 32 condition, 1
# mask), 32 out, Qwen2.5-VL-7B's text width 3584, ByT5's glyph width 1472, SigLIP's image width 1152, a 2-layer token
# refiner
HYV15_480P_T2V_TRANSFORMER = {
    "in_channels": 65,
    "out_channels": 32,
    "num_attention_heads": 16,
    "attention_head_dim": 128,
    "num_layers": 54,
    "num_refiner_layers": 2,
    "mlp_ratio": 4.0,
    "patch_size": 1,
    "patch_size_t": 1,
    "qk_norm": "rms_norm",
    "text_embed_dim": 3584,
    "text_embed_2_dim": 1472,
    "image_embed_dim": 1152,
    "rope_theta": 256.0,
    "rope_axes_dim": (16, 56, 56),
    "target_size": 640,
    "task_type": "t2v",
    "use_meanflow": False,
}
# LTX-2's audio-video transformer (Lightricks/LTX-2, diffusers' scripts/convert_ltx2_to_diffusers.py version "2.0"
# transformer config; ``LTX2VideoTransformer3DModel``'s defaults are the same numbers): 48 blocks, video stream 32
# heads of 128 (4096 wide), audio stream 32 heads of 64 (2048 wide), 128 latent channels each, Gemma 3 12B's text width
# 3840 (the connectors' output)
LTX2_TRANSFORMER = {
    "in_channels": 128,
    "out_channels": 128,
    "patch_size": 1,
    "patch_size_t": 1,
    "num_attention_heads": 32,
    "attention_head_dim": 128,
    "cross_attention_dim": 4096,
    "audio_in_channels": 128,
    "audio_out_channels": 128,
    "audio_num_attention_heads": 32,
    "audio_attention_head_dim": 64,
    "audio_cross_attention_dim": 2048,
    "num_layers": 48,
    "qk_norm": "rms_norm_across_heads",
    "norm_elementwise_affine": False,
    "caption_channels": 3840,
    "rope_theta": 10000.0,
    "causal_offset": 1,
}
# its video VAE (the same script's "2.0" video VAE config: ``AutoencoderKLLTX2Video``'s defaults with a non-causal
# decoder, 32 pixels and 8 frames per latent cell, 128 latent channels); the audio VAE and vocoder are diffusers'
# defaults, the released ones (8 latent channels x 16 latent mel bins = the transformer's 128 audio channels)
LTX2_VIDEO_VAE = {"decoder_causal": False, "spatial_compression_ratio": 32, "temporal_compression_ratio": 8}
# its vae/config.json (the Wan2.2 VAE, diffusers' scripts/convert_wan_to_diffusers.py ``vae22_diffusers_config``):
# 2×2 pixel patchify (12 channels), 16 px per latent cell, 4 frames per latent frame, 48 latent channels; the
# per-channel latent statistics are left at 0 / 1 (random weights: they change no cost)
WAN22_VAE = {
    "base_dim": 160,
    "decoder_base_dim": 256,
    "z_dim": 48,
    "dim_mult": [1, 2, 4, 4],
    "num_res_blocks": 2,
    "temperal_downsample": [False, True, True],
    "is_residual": True,
    "in_channels": 12,
    "out_channels": 12,
    "patch_size": 2,
    "scale_factor_spatial": 16,
    "scale_factor_temporal": 4,
    "latents_mean": [0.0] * 48,
    "latents_std": [1.0] * 48,
}


@torch.no_grad()
def fill_random_(module: torch.nn.Module, seed: int = 0) -> None:
    """Weights uniform in ±1/sqrt(fan_in) (keeps activations finite through 60 blocks), norms 1, biases 0."""
    generator = None
    for name, param in module.named_parameters():
        if generator is None or generator.device != param.device:
            generator = torch.Generator(param.device).manual_seed(seed)
        if param.ndim >= 2:
            bound = 1.0 / math.sqrt(param[0].numel())
            param.uniform_(-bound, bound, generator=generator)
        elif "norm" in name and name.endswith("weight"):
            param.fill_(1.0)
        else:
            param.zero_()


def write_full_size_model_dir(out: Path, builder: str = "qwen_image") -> Path:
    """A diffusers Qwen-Image directory (``builder="qwen_image_edit"``: Qwen-Image-Edit, whose transformer is
    Qwen-Image's): tiny text side (and vision tower), full-size random VAE, full-size transformer config only."""
    from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel

    from verl_omni.utils.tiny_models import build_tiny_model

    build_tiny_model(builder, out, seed=0, dtype="bfloat16")
    # diffusers' defaults are the released architecture; the config is all the engine reads
    text = {"joint_attention_dim": _hidden_size(out / "text_encoder" / "config.json")}
    _write_config_only(out / "transformer", QwenImageTransformer2DModel, **text)
    _write_random(out / "vae", AutoencoderKLQwenImage())
    return out


def build_diffusers_transformer(model_dir: Path, device: str = "cuda", dtype=torch.bfloat16):
    """The transformer of ``model_dir`` (config only) built on ``device`` with :func:`fill_random_` weights."""
    from diffusers import QwenImageTransformer2DModel

    config = QwenImageTransformer2DModel.load_config(model_dir / "transformer")
    with torch.device(device):
        transformer = QwenImageTransformer2DModel.from_config(config).to(dtype)
    fill_random_(transformer)
    return transformer


def write_full_size_sd3_dir(out: Path) -> Path:
    """A diffusers SD3.5 Medium directory: tiny text side, full-size random VAE, full-size transformer config only.

    The transformer's text widths are the tiny encoders' (T5 ``d_model`` for ``joint_attention_dim``, the two
    CLIP projections for ``pooled_projection_dim``); the text sequence keeps its length (77 CLIP + 256 T5
    tokens), so attention costs what it costs with the released encoders; only the caption projection shrinks.
    """
    from diffusers import AutoencoderKL, SD3Transformer2DModel

    from verl_omni.utils.tiny_models import build_tiny_model

    build_tiny_model("sd3", out, seed=0, dtype="bfloat16")
    text = {
        "joint_attention_dim": _hidden_size(out / "text_encoder_3" / "config.json", "d_model"),
        "pooled_projection_dim": _hidden_size(out / "text_encoder" / "config.json", "projection_dim")
        + _hidden_size(out / "text_encoder_2" / "config.json", "projection_dim"),
    }
    _write_config_only(out / "transformer", SD3Transformer2DModel, **{**SD35_MEDIUM_TRANSFORMER, **text})
    _write_random(out / "vae", AutoencoderKL(**SD3_VAE))
    return out


def write_full_size_wan_dir(out: Path, builder: str = "wan2_2") -> Path:
    """A diffusers Wan2.2 directory: tiny UMT5 text side, the full-size transformer's config only (``builder``
    ``"wan2_2"``: TI2V-5B with the full-size random Wan2.2 VAE; ``"wan2_2_a14b"``, ``"wan2_2_i2v_a14b"``: both A14B
    experts with the full-size random Wan2.1 VAE, diffusers' ``AutoencoderKLWan`` defaults: its 16 latent channels
    are what the experts take in, and the I2V experts' 36 are its 16 noisy and 16 source-image channels with the
    4-frame mask, so a tiny VAE's channels would not fit them). The transformer's
    ``text_dim`` is the tiny encoder's; the prompt keeps its 512 padded tokens, so the cross-attention costs what it
    costs with UMT5-XXL (only the text projection shrinks)."""
    from diffusers import AutoencoderKLWan, WanTransformer3DModel

    from verl_omni.utils.tiny_models import build_tiny_model

    config, components = WAN_FULL_SIZE[builder]
    build_tiny_model(builder, out, seed=0, dtype="bfloat16")
    text = {"text_dim": _hidden_size(out / "text_encoder" / "config.json", "d_model")}
    for sub in components:
        _write_config_only(out / sub, WanTransformer3DModel, **{**config, **text})
    _write_random(out / "vae", AutoencoderKLWan(**WAN22_VAE) if builder == "wan2_2" else AutoencoderKLWan())
    return out


def _clear(component: Path) -> Path:
    """``component``'s tiny files removed (its full-size config or weights are written in their place)."""
    for stale in component.iterdir():
        stale.unlink()
    return component


def _write_config_only(component: Path, model_cls, **config) -> None:
    """``model_cls(**config)``'s config alone in ``component``, in place of the tiny one: built on ``meta``, so no
    weights are made (the benchmark fills them on the GPU)."""
    with torch.device("meta"):
        model = model_cls(**config)
    model.save_config(_clear(component))


def _write_random(component: Path, model) -> None:
    """``model`` with its random initial weights, in bf16, in place of ``component``'s tiny one."""
    model.to(torch.bfloat16).save_pretrained(_clear(component))


def _hidden_size(config_file: Path, key: str = "hidden_size") -> int:
    """A tiny text encoder's width (a multimodal config's text part where it has one)."""
    config = json.loads(config_file.read_text())
    return int(config.get("text_config", config)[key])


def write_full_size_flux2_dir(out: Path, builder: str = "flux2_klein_distilled") -> Path:
    """A diffusers FLUX.2 directory (``builder`` ``"flux2"``: FLUX.2-dev, its tiny Mistral text side; otherwise
    klein 4B, its tiny Qwen3 one), the full-size transformer's config only, the full-size random FLUX.2 VAE
    (diffusers' ``AutoencoderKLFlux2`` defaults). The transformer's text width is three of the tiny encoder's hidden
    states; the prompt keeps its 512 padded tokens, so attention costs what it costs with the released encoder (only
    the text projection shrinks)."""
    from diffusers import AutoencoderKLFlux2, Flux2Transformer2DModel

    from verl_omni.utils.tiny_models import build_tiny_model

    build_tiny_model(builder, out, seed=0, dtype="bfloat16")
    config = FLUX2_DEV_TRANSFORMER if builder == "flux2" else FLUX2_KLEIN_4B_TRANSFORMER
    text = {"joint_attention_dim": 3 * _hidden_size(out / "text_encoder" / "config.json")}
    _write_config_only(out / "transformer", Flux2Transformer2DModel, **{**config, **text})
    _write_random(out / "vae", AutoencoderKLFlux2())
    return out


def write_full_size_hunyuan_video_1_5_dir(out: Path) -> Path:
    """A diffusers HunyuanVideo-1.5 480p text-to-video directory: the tiny Qwen2.5-VL and ByT5 text side, the
    full-size transformer's config only (its two text widths the tiny encoders'; the prompt keeps its 1000 masked
    Qwen tokens), the full-size random VAE (diffusers' ``AutoencoderKLHunyuanVideo15`` defaults, the released one)."""
    from diffusers import AutoencoderKLHunyuanVideo15, HunyuanVideo15Transformer3DModel

    from verl_omni.utils.tiny_models import build_tiny_model

    build_tiny_model("hunyuan_video_1_5", out, seed=0, dtype="bfloat16")
    text = {
        "text_embed_dim": _hidden_size(out / "text_encoder" / "config.json"),
        "text_embed_2_dim": _hidden_size(out / "text_encoder_2" / "config.json", "d_model"),
    }
    _write_config_only(out / "transformer", HunyuanVideo15Transformer3DModel, **{**HYV15_480P_T2V_TRANSFORMER, **text})
    _write_random(out / "vae", AutoencoderKLHunyuanVideo15())
    return out


def write_full_size_ltx2_dir(out: Path) -> Path:
    """A diffusers LTX-2 directory: the tiny Gemma 3 and text connectors, the full-size transformer's config only
    (its caption width the tiny connectors'; the contexts keep their 1024 tokens), the full-size random video VAE,
    audio VAE and vocoder."""
    from diffusers import AutoencoderKLLTX2Audio, AutoencoderKLLTX2Video, LTX2VideoTransformer3DModel
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    from verl_omni.utils.tiny_models import build_tiny_model

    build_tiny_model("ltx2", out, seed=0, dtype="bfloat16")
    text = {"caption_channels": _hidden_size(out / "connectors" / "config.json", "caption_channels")}
    _write_config_only(out / "transformer", LTX2VideoTransformer3DModel, **{**LTX2_TRANSFORMER, **text})
    _write_random(out / "vae", AutoencoderKLLTX2Video(**LTX2_VIDEO_VAE))
    _write_random(out / "audio_vae", AutoencoderKLLTX2Audio())
    _write_random(out / "vocoder", LTX2Vocoder())
    return out

"""Full-size Qwen-Image and SD3.5 Medium with random weights and no weight file, for throughput benchmarks.

FLOPs do not depend on the weights, and writing the 20 B transformer (~40 GB in bf16) to disk
would cost minutes on every GPU machine. So the benchmark directory holds the transformer's
``config.json`` only, and the engine's pipelines fill the weights in place on the device instead
of reading them (``load_weights`` never touches the weight iterator). The text side (tokenizer,
text encoder) is the tiny model's: it is not what is timed, and the transformer's
``joint_attention_dim`` is set to its hidden size. The VAE is the full-size architecture with
random weights (~0.25 GB, written once).

The engine imports the pipeline classes by name in its worker processes: the benchmark puts this
directory on ``PYTHONPATH`` before it starts an engine.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from vllm_omni.diffusion.models.qwen_image.pipeline_qwen_image import QwenImagePipeline
from vllm_omni.diffusion.models.sd3.pipeline_sd3 import StableDiffusion3Pipeline

from verl_omni.pipelines.qwen_image.rollout_pipeline import QwenImageLogProbPipeline
from verl_omni.pipelines.sd3.rollout_pipeline import SD3LogProbPipeline

LOG_PROB_PIPELINE = "random_weights.RandomLogProbQwenImagePipeline"
STOCK_PIPELINE = "random_weights.RandomStockQwenImagePipeline"
SD3_LOG_PROB_PIPELINE = "random_weights.RandomLogProbSD3Pipeline"
SD3_STOCK_PIPELINE = "random_weights.RandomStockSD3Pipeline"
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


class RandomWeightsMixin:
    """``load_weights`` that fills the transformer in place and reports every parameter loaded."""

    def load_weights(self, weights) -> set[str]:
        fill_random_(self.transformer)
        return {name for name, _ in self.named_parameters()}


class RandomLogProbQwenImagePipeline(RandomWeightsMixin, QwenImageLogProbPipeline):
    """The rollout's log-prob pipeline on random full-size weights."""


class RandomStockQwenImagePipeline(RandomWeightsMixin, QwenImagePipeline):
    """vLLM-Omni's own Qwen-Image pipeline on the same random weights."""


class RandomLogProbSD3Pipeline(RandomWeightsMixin, SD3LogProbPipeline):
    """The SD3 rollout's log-prob pipeline on random full-size weights."""


class RandomStockSD3Pipeline(RandomWeightsMixin, StableDiffusion3Pipeline):
    """vLLM-Omni's own SD3 pipeline on the same random weights."""


def write_full_size_model_dir(out: Path) -> Path:
    """A diffusers directory: tiny text side, full-size random VAE, full-size transformer config only."""
    from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel

    from verl_omni.utils.tiny_models import build_tiny_model

    build_tiny_model("qwen_image", out, seed=0, dtype="bfloat16")
    text_config = json.loads((out / "text_encoder" / "config.json").read_text())
    text_hidden = int(text_config.get("text_config", text_config).get("hidden_size", text_config.get("hidden_size")))
    transformer_dir = out / "transformer"
    for stale in transformer_dir.iterdir():
        stale.unlink()
    # diffusers' defaults are the released architecture; the config is all the engine reads
    with torch.device("meta"):
        transformer = QwenImageTransformer2DModel(joint_attention_dim=text_hidden)
    transformer.save_config(transformer_dir)
    vae = AutoencoderKLQwenImage().to(torch.bfloat16)
    vae.save_pretrained(out / "vae")
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
    t5 = json.loads((out / "text_encoder_3" / "config.json").read_text())
    clip_l = json.loads((out / "text_encoder" / "config.json").read_text())
    clip_g = json.loads((out / "text_encoder_2" / "config.json").read_text())
    text = {
        "joint_attention_dim": int(t5["d_model"]),
        "pooled_projection_dim": int(clip_l["projection_dim"]) + int(clip_g["projection_dim"]),
    }
    transformer_dir = out / "transformer"
    for stale in transformer_dir.iterdir():
        stale.unlink()
    with torch.device("meta"):
        transformer = SD3Transformer2DModel(**{**SD35_MEDIUM_TRANSFORMER, **text})
    transformer.save_config(transformer_dir)
    vae_dir = out / "vae"
    for stale in vae_dir.iterdir():
        stale.unlink()
    AutoencoderKL(**SD3_VAE).to(torch.bfloat16).save_pretrained(vae_dir)
    return out

"""Tiny random LTX-2 in diffusers format: the audio-video DiT, both VAEs, the vocoder, Gemma 3, its connectors.

Laid out like the released ``Lightricks/LTX-2`` diffusers checkpoint (``LTX2Pipeline``): the video VAE
keeps the release's compression (4x4 pixel patchify and three spatial down-samplings, 32 pixels per
latent cell; three temporal ones, ``num_frames = 8k + 1``), the audio VAE the release's mel layout
(16 kHz, hop 160, 4x in time and in mel bins), the vocoder the release's upsampling to 24 kHz, and the
scheduler config is the released one (exponential dynamic shift pinned at ``max_shift``, terminal
stretch 0.1), so diffusers, vLLM-Omni and the trainer read the same facts from it as from the real
model (its video decoder pads with zeros, so that a 32-pixel side, one latent cell, decodes). The text encoder is a Gemma 3 (with a vision tower, as ``Gemma3ForConditionalGeneration``
needs) whose stacked hidden states the connectors turn into the video and audio contexts; its
tokenizer is trained here on the generated prompt corpus. The video latent channels equal the
audio's (latent channels x latent mel bins), as in the release (128 each): the rollout records one
joint token sequence (``training_adapter``). Only the widths and depths are tiny.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from verl_omni.utils.tiny_models import components as parts

logger = logging.getLogger(__name__)

# scheduler/scheduler_config.json of the released LTX-2 checkpoint
LTX2_SCHEDULER_CONFIG = {
    "base_image_seq_len": 1024,
    "base_shift": 0.95,
    "max_image_seq_len": 4096,
    "max_shift": 2.05,
    "num_train_timesteps": 1000,
    "shift": 1.0,
    "shift_terminal": 0.1,
    "time_shift_type": "exponential",
    "use_dynamic_shifting": True,
}
# Gemma 3's hidden size (the connectors' caption channels) and layers (+1: the embeddings' output is stacked too)
GEMMA_HIDDEN = 32
GEMMA_LAYERS = 2
# learned registers per connector: they replace the padding of the 1024 prompt tokens (a divisor of 1024)
CONNECTOR_REGISTERS = 16
VIDEO_LATENT_CHANNELS = 8
AUDIO_LATENT_CHANNELS = 2
# 16 mel bins / the audio VAE's 4x: 4 latent mel bins, so 2 x 4 = 8 channels per audio token (= the video's 8)
AUDIO_MEL_BINS = 16
GEMMA_SPECIAL_TOKENS = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>")
GEMMA_IMAGE_TOKENS = ("<start_of_image>", "<end_of_image>", "<image_soft_token>")


def gemma_tokenizer(vocab_size: int = 512):
    """A ``GemmaTokenizer`` (SentencePiece-style BPE on ``▁``-marked words, byte fallback) trained on the corpus."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import GemmaTokenizer

    from verl_omni.utils.tiny_models.tokenizer import tokenizer_corpus

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    specials = [*GEMMA_SPECIAL_TOKENS, *GEMMA_IMAGE_TOKENS]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False)
    tok.train_from_iterator(tokenizer_corpus(), trainer=trainer)
    state = json.loads(tok.to_str())
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in state["model"]["merges"]]
    tokenizer = GemmaTokenizer(vocab=tok.get_vocab(), merges=merges, add_bos_token=True)
    tokenizer.add_special_tokens({"additional_special_tokens": list(GEMMA_IMAGE_TOKENS)})
    return tokenizer


def _gemma3(tokenizer):
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3TextConfig, SiglipVisionConfig

    ids = tokenizer.convert_tokens_to_ids
    text = Gemma3TextConfig(
        vocab_size=len(tokenizer),
        hidden_size=GEMMA_HIDDEN,
        intermediate_size=2 * GEMMA_HIDDEN,
        num_hidden_layers=GEMMA_LAYERS,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=2048,
        sliding_window=64,
        pad_token_id=ids("<pad>"),
        bos_token_id=ids("<bos>"),
        eos_token_id=ids("<eos>"),
    )
    vision = SiglipVisionConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14
    )
    config = Gemma3Config(
        text_config=text.to_dict(),
        vision_config=vision.to_dict(),
        mm_tokens_per_image=4,
        boi_token_index=ids("<start_of_image>"),
        eoi_token_index=ids("<end_of_image>"),
        image_token_index=ids("<image_soft_token>"),
    )
    return Gemma3ForConditionalGeneration(config).eval()


def _connectors():
    from diffusers.pipelines.ltx2 import LTX2TextConnectors

    return LTX2TextConnectors(
        caption_channels=GEMMA_HIDDEN,
        text_proj_in_factor=GEMMA_LAYERS + 1,
        video_connector_num_attention_heads=2,
        video_connector_attention_head_dim=16,
        video_connector_num_layers=1,
        video_connector_num_learnable_registers=CONNECTOR_REGISTERS,
        audio_connector_num_attention_heads=2,
        audio_connector_attention_head_dim=16,
        audio_connector_num_layers=1,
        audio_connector_num_learnable_registers=CONNECTOR_REGISTERS,
    ).eval()


def _transformer():
    from diffusers import LTX2VideoTransformer3DModel

    return LTX2VideoTransformer3DModel(
        in_channels=VIDEO_LATENT_CHANNELS,
        out_channels=VIDEO_LATENT_CHANNELS,
        num_attention_heads=2,
        attention_head_dim=24,
        cross_attention_dim=48,
        audio_in_channels=AUDIO_LATENT_CHANNELS * AUDIO_MEL_BINS // 4,
        audio_out_channels=AUDIO_LATENT_CHANNELS * AUDIO_MEL_BINS // 4,
        audio_num_attention_heads=2,
        audio_attention_head_dim=8,
        audio_cross_attention_dim=16,
        num_layers=2,
        caption_channels=GEMMA_HIDDEN,
    ).eval()


def _video_vae():
    from diffusers import AutoencoderKLLTX2Video

    return AutoencoderKLLTX2Video(
        latent_channels=VIDEO_LATENT_CHANNELS,
        block_out_channels=(8, 16, 32, 64),
        decoder_block_out_channels=(8, 16, 32),
        layers_per_block=(1, 1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1),
        # what the release's config states: its down-sampling types give 4 x 2^3 pixels and 2^3 frames per cell
        spatial_compression_ratio=32,
        temporal_compression_ratio=8,
        # zero padding where the release reflects: a 32-pixel side is one latent cell, which reflection cannot pad
        decoder_spatial_padding_mode="zeros",
    ).eval()


def _audio_vae():
    from diffusers import AutoencoderKLLTX2Audio

    return AutoencoderKLLTX2Audio(
        base_channels=8, ch_mult=(1, 2, 4), num_res_blocks=1, latent_channels=AUDIO_LATENT_CHANNELS, mel_bins=16
    ).eval()


def _vocoder():
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    # stereo mel frames in (2 channels x 16 bins), the release's 240x upsampling (100 mel frames/s to 24 kHz)
    return LTX2Vocoder(in_channels=2 * AUDIO_MEL_BINS, hidden_channels=32).eval()


def build_tiny_ltx2(out_dir: Path, seed: int = 0, dtype: str = "float32") -> Path:
    """Write a tiny random LTX-2 pipeline to ``out_dir``; the same seed gives the same files.

    Returns ``out_dir``, loadable with ``LTX2Pipeline.from_pretrained(out_dir)`` (sizes multiples of 32, frames
    8k + 1; 32² and one frame included).
    """
    from diffusers import FlowMatchEulerDiscreteScheduler, LTX2Pipeline

    tokenizer = gemma_tokenizer()
    out = parts.save_pipeline(
        LTX2Pipeline,
        Path(out_dir),
        seed,
        dtype,
        {
            "transformer": _transformer,
            "vae": _video_vae,
            "audio_vae": _audio_vae,
            "vocoder": _vocoder,
            "connectors": _connectors,
            "text_encoder": lambda: _gemma3(tokenizer),
        },
        scheduler=FlowMatchEulerDiscreteScheduler(**LTX2_SCHEDULER_CONFIG),
        tokenizer=tokenizer,
    )
    logger.info("tiny LTX-2 written to %s", out)
    return out

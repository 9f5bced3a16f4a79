"""Tiny random Qwen-Image-Edit in diffusers format (Qwen-Image's parts plus a Qwen2.5-VL vision tower and processor).

``diffusers.QwenImageEditPipeline.from_pretrained`` and vLLM-Omni's edit pipeline load it through the
real model's code paths: the text encoder is a Qwen2.5-VL whose vision tower writes into the text
stream (its ``out_hidden_size`` is the text width), and ``processor/`` is a ``Qwen2VLProcessor`` whose
image processor keeps the vision tokens few (:data:`VL_MAX_PIXELS`) so the CPU runs stay fast.
"""

from __future__ import annotations

import logging
from pathlib import Path

from verl_omni.pipelines.qwen_image import tiny_model as qwen_image
from verl_omni.utils.tiny_models import components as parts
from verl_omni.utils.tiny_models.tokenizer import build_qwen2_tokenizer

logger = logging.getLogger(__name__)

# pixel budget of the processor's resize of the source image for the vision tower: 56² is 4×4 patches
# of 14 px, 4 vision tokens after the 2×2 merge (the released processor allows up to 12845056)
VL_MIN_PIXELS = 28 * 28
VL_MAX_PIXELS = 56 * 56


def _text_encoder(tokenizer):
    """Qwen-Image's tiny Qwen2.5-VL with a vision tower that outputs the text width (the edit prompt holds image tokens)."""
    model = qwen_image._text_encoder(tokenizer)
    config = model.config
    config.vision_config.out_hidden_size = qwen_image.TEXT_HIDDEN_SIZE
    from transformers import Qwen2_5_VLForConditionalGeneration

    return Qwen2_5_VLForConditionalGeneration(config).eval()


def build_processor(tokenizer):
    """``Qwen2VLProcessor`` (image processor + the tokenizer; the video processor it requires is unused) with a tiny
    pixel budget."""
    from transformers import Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor

    image_processor = Qwen2VLImageProcessor(min_pixels=VL_MIN_PIXELS, max_pixels=VL_MAX_PIXELS)
    return Qwen2VLProcessor(
        image_processor=image_processor, tokenizer=tokenizer, video_processor=Qwen2VLVideoProcessor()
    )


def build_tiny_qwen_image_edit(out_dir: Path, seed: int = 0, dtype: str = "float32", pipeline_class=None) -> Path:
    """Write a tiny random Qwen-Image-Edit pipeline to ``out_dir``; the same seed gives the same weights.

    ``pipeline_class``: the diffusers pipeline saved (default ``QwenImageEditPipeline``; the Plus variant's builder
    passes ``QwenImageEditPlusPipeline``, same components). Returns ``out_dir``, loadable with its
    ``from_pretrained(out_dir)``.
    """
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImageEditPipeline

    tokenizer = build_qwen2_tokenizer()
    out = parts.save_pipeline(
        pipeline_class or QwenImageEditPipeline,
        Path(out_dir),
        seed,
        dtype,
        {
            "transformer": qwen_image._transformer,
            "vae": qwen_image._vae,
            "text_encoder": lambda: _text_encoder(tokenizer),
        },
        scheduler=FlowMatchEulerDiscreteScheduler(**qwen_image.QWEN_IMAGE_SCHEDULER_CONFIG),
        tokenizer=tokenizer,
        processor=build_processor(tokenizer),
    )
    logger.info("tiny %s written to %s", (pipeline_class or QwenImageEditPipeline).__name__, out)
    return out

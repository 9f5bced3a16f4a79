"""Qwen-Image-Edit Plus on the training side: Qwen-Image-Edit's replay with every source image's tokens
(their grids recorded per image, ``image_latents_grid`` ``[K, 2]``)."""

from __future__ import annotations

from verl_omni.pipelines.model_base import register_model_adapter
from verl_omni.pipelines.qwen_image_edit.training_adapter import QwenImageEditTrainingAdapter

# vLLM-Omni 0.26's limit of the Plus pipeline (QWEN_IMAGE_EDIT_PLUS_MAX_INPUT_IMAGES)
MAX_SOURCE_IMAGES = 4


@register_model_adapter("QwenImageEditPlusPipeline")
class QwenImageEditPlusTrainingAdapter(QwenImageEditTrainingAdapter):
    """Training adapter for ``QwenImageEditPlusPipeline`` checkpoints (2509 / 2511: 1 to 4 source images)."""

    rollout_pipeline = "verl_omni.pipelines.qwen_image_edit_plus.rollout_pipeline.QwenImageEditPlusLogProbPipeline"
    lora_file_pipeline = "QwenImageEditPlusPipeline"
    # vl_condition_area: pixels of each source image as the vision tower sees it (default the stock 384²)
    sampling_keys = ("condition_area", "vl_condition_area")
    max_source_images = MAX_SOURCE_IMAGES

    @classmethod
    def prompt_token_ids(cls, tokenizer, prompt: str) -> list[int]:
        """The edit template with a ``Picture 1:`` block (the rollout adds one per further source image)."""
        from verl_omni.pipelines.qwen_image_edit.rollout_request import PICTURE_BLOCK, prompt_token_ids

        return prompt_token_ids(tokenizer, prompt, PICTURE_BLOCK.format(1))

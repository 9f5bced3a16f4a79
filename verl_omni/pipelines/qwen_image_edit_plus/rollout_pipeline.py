"""vLLM-Omni Qwen-Image-Edit Plus pipeline recording the SDE trajectory (see ``qwen_image_edit.rollout_pipeline``)."""

from __future__ import annotations

from vllm_omni.diffusion.models.qwen_image.pipeline_qwen_image_edit_plus import (
    CONDITION_IMAGE_SIZE,
    MAX_QWEN_IMAGE_EDIT_PLUS_INPUT_IMAGES,
    QwenImageEditPlusPipeline,
)

from verl_omni.pipelines.qwen_image_edit.rollout_pipeline import QwenImageEditRolloutMixin
from verl_omni.pipelines.qwen_image_edit.rollout_request import picture_ids


class QwenImageEditPlusLogProbPipeline(QwenImageEditRolloutMixin, QwenImageEditPlusPipeline):
    """Qwen-Image-Edit Plus rollout pipeline: token ids and 1 to 4 source images in; images, trajectories out."""

    max_source_images = MAX_QWEN_IMAGE_EDIT_PLUS_INPUT_IMAGES
    # the stock pipeline's vision-tower size of each source image
    default_vl_condition_area = CONDITION_IMAGE_SIZE

    def image_prompt_ids(self, ids: list[int], count: int) -> list[int]:
        """``Picture 2:`` ... ``Picture <count>:`` blocks after the ids' ``Picture 1:`` block."""
        return picture_ids(self.tokenizer, ids, count)

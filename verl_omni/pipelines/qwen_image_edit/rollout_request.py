"""The Qwen-Image-Edit prompt: template, token ids, the source image's sizes, and where the image travels.

A request's prompt is the templated instruction as token ids with one ``<|image_pad|>`` (what
:func:`prompt_token_ids` returns; the rollout pipeline widens it to the vision tower's token count),
and its source image in vLLM-Omni's multimodal input, ``prompt["multi_modal_data"]["image"]``.
"""

from __future__ import annotations

import math
from typing import Any

# the edit chat template and its dropped prefix, as vLLM-Omni's and diffusers' QwenImageEditPipeline use them
QWEN_IMAGE_EDIT_PROMPT_TEMPLATE = (
    "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, objects, "
    "background), then explain how the user's text instruction should alter or modify the image. Generate a new "
    "image that meets the user's requirements while maintaining consistency with the original input where "
    "appropriate.<|im_end|>\n<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>{}<|im_end|>\n"
    "<|im_start|>assistant\n"
)
QWEN_IMAGE_EDIT_PROMPT_DROP_TOKENS = 64
IMAGE_PAD_TOKEN = "<|image_pad|>"
# pixels of the source image as the VAE and the vision tower see it (the stock pipelines' 1024²); the image keeps
# its aspect ratio, sides rounded to CONDITION_SIDE_MULTIPLE
DEFAULT_CONDITION_AREA = 1024 * 1024
CONDITION_SIDE_MULTIPLE = 32


def prompt_token_ids(tokenizer, instruction: str) -> list[int]:
    """Token ids the rollout pipeline expects for ``instruction``: the edit template, one image placeholder."""
    return list(tokenizer(QWEN_IMAGE_EDIT_PROMPT_TEMPLATE.format(instruction)).input_ids)


def expand_image_pads(ids: list[int], pad_id: int, count: int) -> list[int]:
    """``ids`` with its one ``pad_id`` widened to ``count`` copies (what the processor does to the text)."""
    if ids.count(pad_id) != 1:
        raise ValueError(
            f"an edit prompt holds exactly one image placeholder token (id {pad_id}), got {ids.count(pad_id)}: "
            "build the ids with QwenImageEditTrainingAdapter.prompt_token_ids"
        )
    at = ids.index(pad_id)
    return ids[:at] + [pad_id] * count + ids[at + 1 :]


def condition_size(width: int, height: int, area: float) -> tuple[int, int]:
    """``(width, height)`` of the source image as conditioned on: ``area`` pixels at its aspect ratio, sides
    rounded to :data:`CONDITION_SIDE_MULTIPLE` (vLLM-Omni's ``calculate_dimensions``, the area a setting)."""
    ratio = width / height
    w = math.sqrt(area * ratio)
    side = CONDITION_SIDE_MULTIPLE
    return max(side, round(w / side) * side), max(side, round(w / ratio / side) * side)


def source_image(prompt: Any, request_id: str):
    """The one source image of a request's prompt, as an RGB PIL image."""
    import PIL.Image

    data = prompt.get("multi_modal_data") if isinstance(prompt, dict) else None
    image = (data or {}).get("image")
    if isinstance(image, (list, tuple)):
        if len(image) != 1:
            raise ValueError(f"request {request_id}: Qwen-Image-Edit takes one source image, got {len(image)}")
        image = image[0]
    if image is None:
        raise ValueError(
            f"request {request_id} has no source image: an edit prompt carries it in multi_modal_data['image']"
        )
    if isinstance(image, str):
        image = PIL.Image.open(image)
    if not isinstance(image, PIL.Image.Image):
        raise TypeError(f"request {request_id}: the source image must be a PIL image or a path, got {type(image)}")
    return image.convert("RGB")

"""The Qwen-Image-Edit prompt: template, token ids and the source images' sizes.

A request's prompt is the templated instruction as token ids with one ``<|image_pad|>`` (what
:func:`prompt_token_ids` returns; the rollout pipeline widens it to the vision tower's token count,
and the multi-image "Plus" pipeline first adds a ``Picture i:`` block per further image), and its
source images in vLLM-Omni's multimodal input (``verl_omni.pipelines.rollout_request.source_images``).
"""

from __future__ import annotations

# the edit chat template and its dropped prefix, as vLLM-Omni's and diffusers' QwenImageEditPipeline use them
QWEN_IMAGE_EDIT_PROMPT_TEMPLATE = (
    "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, objects, "
    "background), then explain how the user's text instruction should alter or modify the image. Generate a new "
    "image that meets the user's requirements while maintaining consistency with the original input where "
    "appropriate.<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
)
QWEN_IMAGE_EDIT_PROMPT_DROP_TOKENS = 64
# one source image's place in the prompt: Qwen-Image-Edit's, and the "Plus" pipelines' numbered one
IMAGE_BLOCK = "<|vision_start|><|image_pad|><|vision_end|>"
PICTURE_BLOCK = "Picture {}: " + IMAGE_BLOCK
IMAGE_PAD_TOKEN = "<|image_pad|>"
VISION_END_TOKEN = "<|vision_end|>"
# pixels of a source image as the VAE sees it (the stock pipelines' 1024²); the image keeps its aspect ratio,
# sides rounded to CONDITION_SIDE_MULTIPLE (vLLM-Omni's ``calculate_dimensions``)
DEFAULT_CONDITION_AREA = 1024 * 1024
CONDITION_SIDE_MULTIPLE = 32


def prompt_token_ids(tokenizer, instruction: str, image_block: str = IMAGE_BLOCK) -> list[int]:
    """Token ids the rollout pipeline expects for ``instruction``: the edit template, one image block."""
    return list(tokenizer(QWEN_IMAGE_EDIT_PROMPT_TEMPLATE.format(image_block + instruction)).input_ids)


def picture_ids(tokenizer, ids: list[int], count: int) -> list[int]:
    """``ids`` (one ``Picture 1:`` block) with blocks ``Picture 2:`` ... ``Picture <count>:`` after it, as the
    Plus pipelines' text has them (the text between two special tokens tokenizes on its own, so the ids are
    the whole text's)."""
    end = tokenizer.convert_tokens_to_ids(VISION_END_TOKEN)
    at = ids.index(end) + 1
    blocks = [t for i in range(2, count + 1) for t in tokenizer(PICTURE_BLOCK.format(i)).input_ids]
    return ids[:at] + blocks + ids[at:]


def expand_image_pads(ids: list[int], pad_id: int, counts: list[int]) -> list[int]:
    """``ids`` with its k-th ``pad_id`` widened to ``counts[k]`` copies (what the processor does to the text)."""
    if ids.count(pad_id) != len(counts):
        raise ValueError(
            f"the edit prompt holds {ids.count(pad_id)} image placeholder tokens (id {pad_id}) for {len(counts)} "
            "source images: build the ids with the edit adapter's prompt_token_ids"
        )
    out, k = [], 0
    for token in ids:
        if token == pad_id:
            out.extend([pad_id] * counts[k])
            k += 1
        else:
            out.append(token)
    return out

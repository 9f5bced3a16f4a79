"""The Qwen-Image prompt template and its token ids, as the rollout pipeline expects them.

Requests are parsed by the shared :mod:`verl_omni.pipelines.rollout_request` (re-exported here).
"""

from __future__ import annotations

from verl_omni.pipelines.rollout_request import RolloutRequest, parse_rollout_request

__all__ = [
    "QWEN_IMAGE_PROMPT_DROP_TOKENS",
    "QWEN_IMAGE_PROMPT_TEMPLATE",
    "RolloutRequest",
    "parse_rollout_request",
    "prompt_token_ids",
]

# The Qwen-Image text-to-image chat template and the number of leading tokens whose hidden states
# are dropped (the fixed system prefix), as vLLM-Omni's and diffusers' Qwen-Image pipelines use them.
QWEN_IMAGE_PROMPT_TEMPLATE = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
    "spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n"
    "<|im_start|>assistant\n"
)
QWEN_IMAGE_PROMPT_DROP_TOKENS = 34


def prompt_token_ids(tokenizer, prompt: str) -> list[int]:
    """Token ids the rollout pipeline expects for ``prompt``: the chat template applied, no padding."""
    return list(tokenizer(QWEN_IMAGE_PROMPT_TEMPLATE.format(prompt)).input_ids)

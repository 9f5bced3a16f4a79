"""``unified_reward``: UnifiedReward (Wang et al. 2025, arXiv:2503.05236) grades a generated image for its prompt.

UnifiedReward is a VLM fine-tuned as a judge; it is served behind an OpenAI-compatible chat endpoint (vLLM or
SGLang, e.g. ``vllm serve CodeGoat24/UnifiedReward-qwen-7b --served-model-name UnifiedReward``) and reached
through the ``vlm_judge`` path (``vlm_judge.py``): one request per sample, the image as a PNG data URL, then the
text of the prompt. Only the defaults differ, taken from the pointwise image-generation form that the
UnifiedReward repository (github.com/CodeGoat24/UnifiedReward) publishes and Flow-GRPO's UnifiedReward reward
sends: the judge is asked to weigh (1) alignment with the caption and (2) overall image quality, and to write one
grade from 1 to 5 after ``Final Score:``; the caption comes last, as ``Text Caption: [<prompt>]``.

The prompt below is our wording of those fields; the parts the model was trained to key on (the two criteria,
the 1-5 scale, the ``Final Score:`` marker, the ``Text Caption: [...]`` line) are kept. The published text
starts with LLaVA's ``<image>`` token; here the image travels as a chat ``image_url`` part that the server
places itself, so the token is left out.

Parsing: the last ``Final Score: N`` in the answer is the raw grade, which must lie in [1, 5] and is mapped to
[0, 1] as ``(N − 1) / 4`` (``normalize: false`` keeps N; Flow-GRPO divides by 5, which differs by an affine map
that GRPO's per-group normalisation removes). An answer without that line, or with a grade outside [1, 5], is a
:class:`ScorerError` for that sample, never a default score (Flow-GRPO counts it as 0): a required scorer stops
the step, an optional one leaves the sample out of its reward (``multi.py``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from verl_omni.utils.reward_score.registry import register_scorer
from verl_omni.utils.reward_score.vlm_judge import VlmJudgeParams, VlmJudgeScorer

logger = logging.getLogger(__name__)

UNIFIED_REWARD_TEMPLATE = (
    "You are given a generated image and the text caption it was generated from. Evaluate the image on two "
    "key criteria:\n"
    "1. Alignment with the Caption: does the image show what the caption describes, with the right objects, "
    "attributes and relations between them?\n"
    "2. Overall Image Quality: is the image clear and detailed, with accurate colours and a pleasing look?\n"
    "Based on the above criteria, assign a score from 1 to 5 after 'Final Score:'.\n"
    "Your task is provided as follows:\n"
    "Text Caption: [{prompt}]"
)
FINAL_SCORE_PATTERN = r"Final Score:\s*([-+]?\d+(?:\.\d+)?)"


@dataclass
class UnifiedRewardParams(VlmJudgeParams):
    """The :class:`VlmJudgeParams` of ``vlm_judge`` with UnifiedReward's defaults: ``prompt_template`` its
    pointwise image-generation prompt, ``score_pattern`` ``Final Score: N``, ``score_min`` 1, ``score_max`` 5.
    ``url`` (the API base, e.g. ``http://host:8080/v1``) and ``model`` (the served model name) are required.
    """

    prompt_template: str = UNIFIED_REWARD_TEMPLATE
    score_pattern: str = FINAL_SCORE_PATTERN
    score_min: float = 1.0
    score_max: float = 5.0


@register_scorer("unified_reward")
class UnifiedRewardScorer(VlmJudgeScorer):
    """UnifiedReward's 1-5 grade of caption alignment and image quality, served. Range [0, 1] (raw [1, 5] with
    `normalize: false`).
    """

    params_cls = UnifiedRewardParams
    judge_name = "unified_reward"

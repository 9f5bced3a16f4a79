"""OCR reward: a vision-language model behind an OpenAI-compatible chat endpoint reads the image.

The target text is the sample's ground truth when the dataset provides one; otherwise the first
double-quoted span of the prompt (straight ``"..."`` or curly ``“...”`` quotes), e.g. the prompt
``A shop sign that reads "OPEN 24H"`` targets ``OPEN 24H``. Both texts are compared lower-cased
with all whitespace removed.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass

from verl_omni.utils.reward_score.base import ScoreBatch, Scorer, ScorerError
from verl_omni.utils.reward_score.http_client import HttpClient, HttpParams, image_to_png_base64
from verl_omni.utils.reward_score.registry import register_scorer

logger = logging.getLogger(__name__)

_QUOTED = re.compile(r"\"([^\"]+)\"|“([^”]+)”")
DEFAULT_INSTRUCTION = "Read all the text in this image. Answer with the text only."


@dataclass
class OcrParams(HttpParams):
    """Args (besides :class:`HttpParams`; ``url`` is the API base, e.g. ``http://host:8000/v1``):
    model (str): model name sent in the request (required).
    instruction (str): text sent with the image.
    max_tokens (int): answer length cap. Default 128.
    """

    model: str = ""
    instruction: str = DEFAULT_INSTRUCTION
    max_tokens: int = 128

    def __post_init__(self):
        super().__post_init__()
        if not self.model:
            raise ValueError("model must name the served VLM, got ''")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (insertions, deletions, substitutions all cost 1)."""
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, start=1):
        current = [i]
        for j, cb in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def _normalize(text: str) -> str:
    return "".join(text.lower().split())


def ocr_similarity(read: str, target: str, contained_is_exact: bool = False) -> float:
    """1 − edit distance / target length (normalized texts), clipped to [0, 1].

    ``contained_is_exact``: a target found inside the read text counts as distance 0 (Flow-GRPO's PaddleOCR
    reward: text around the target is not penalized).
    """
    read, target = _normalize(read), _normalize(target)
    if not target:
        return 1.0 if not read else 0.0
    if contained_is_exact and target in read:
        return 1.0
    return max(0.0, 1.0 - edit_distance(read, target) / len(target))


def find_target(prompt: str, ground_truth: str | None) -> str:
    """The text the image should show: ``ground_truth`` if given, else the prompt's first quoted span."""
    if ground_truth is not None:
        return ground_truth
    match = _QUOTED.search(prompt)
    if match is None:
        raise ValueError(f"ocr scorer: prompt has no quoted target text and no ground truth was given: {prompt!r}")
    return match.group(1) or match.group(2)


@register_scorer("ocr")
class OcrScorer(Scorer):
    """1 − normalized edit distance between the text read by the VLM and the target. Range [0, 1]."""

    params_cls = OcrParams
    per_sample = True

    def __init__(self, params: OcrParams):
        super().__init__(params)
        self.client = HttpClient(params, scorer="ocr")
        self.endpoint = params.url.rstrip("/") + "/chat/completions"

    async def score(self, batch: ScoreBatch) -> list[float]:
        ground_truths = batch.targets or [None] * len(batch)
        targets = [find_target(p, gt) for p, gt in zip(batch.prompts, ground_truths, strict=True)]
        reads = await asyncio.gather(*(self.read_text(image) for image in batch.images))
        return [ocr_similarity(read, target) for read, target in zip(reads, targets, strict=True)]

    async def read_text(self, image) -> str:
        """Ask the VLM for the text in one uint8 ``[3, H, W]`` image."""
        payload = {
            "model": self.params.model,
            "max_tokens": self.params.max_tokens,
            "temperature": 0.0,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image_url",
                            "image_url": {"url": "data:image/png;base64," + image_to_png_base64(image)},
                        },
                        {"type": "text", "text": self.params.instruction},
                    ],
                }
            ],
        }
        answer = await self.client.post_json(self.endpoint, payload)
        try:
            return answer["choices"][0]["message"]["content"] or ""
        except (KeyError, IndexError, TypeError) as e:
            raise ScorerError(f"scorer 'ocr': unexpected chat answer from {self.endpoint}: {answer!r:.200}") from e

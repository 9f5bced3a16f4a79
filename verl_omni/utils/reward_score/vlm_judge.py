"""``vlm_judge``: a vision-language model behind an OpenAI-compatible chat endpoint grades each sample.

One request per sample to ``<url>/chat/completions``: a user turn with the sample's source images
(editing; none for text-to-image), then the generated image, each a ``data:image/png;base64,...``
``image_url`` part, then the text of ``prompt_template`` with ``{prompt}`` replaced by the sample's
prompt (the editing instruction). The answer's ``choices[0].message.content`` is parsed into a raw
score (``judge_parse.py``), which must lie in ``[score_min, score_max]`` and is mapped to [0, 1]
(``normalize``). Transport failures are retried per :class:`HttpParams`; an answer that cannot be
parsed or is out of range is a :class:`ScorerError` (never a default score).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from verl_omni.utils.reward_score.base import ScoreBatch, Scorer, ScorerError
from verl_omni.utils.reward_score.http_client import HttpClient, HttpParams, image_to_png_base64
from verl_omni.utils.reward_score.judge_parse import PARSERS, ScoreParseError, parse_score
from verl_omni.utils.reward_score.registry import register_scorer

logger = logging.getLogger(__name__)

DEFAULT_TEMPLATE = (
    "You grade an AI-generated image. The last image above is the one to grade; any images before it "
    "are the source images it was edited from (with none, it was generated from text alone).\n"
    "Instruction: {prompt}\n"
    "Judge how faithfully the graded image carries out the instruction, whether it keeps what the "
    "instruction leaves unchanged, and whether it looks natural, without artifacts. Reason briefly, "
    "then finish with one line 'Score: N', where N is an integer from 0 (fails) to 10 (perfect)."
)
DEFAULT_PATTERN = r"(?i)score\s*[:=]\s*([-+]?\d+(?:\.\d+)?)"
# request keys the scorer sets itself; extra_body may not override them
_OWN_KEYS = ("model", "messages", "max_tokens", "temperature")


@dataclass
class VlmJudgeParams(HttpParams):
    """Args (besides :class:`HttpParams`; ``url`` is the API base, e.g. ``http://host:8000/v1``):
    model (str): model name sent in the request (required).
    prompt_template (str): the text after the images; ``{prompt}`` (required) becomes the sample's
        prompt, other braces stay as written (JSON examples need no escaping).
    system_prompt (str): a system turn before the user turn; empty for none. Default empty.
    parser (str): ``regex`` (default), ``last_number`` or ``json`` (``judge_parse.py``).
    score_pattern (str): for ``regex``: the last match counts; the mean of its capture groups (the
        whole match without groups) is the raw score. Default: ``Score: N``.
    json_field (str): for ``json``: dotted path of the score in the answer's JSON object (a number,
        or a list of numbers, averaged). Default ``score``.
    score_min (float): lowest raw score the judge gives. Default 0.
    score_max (float): highest raw score the judge gives. Default 10.
    normalize (bool): map the raw score to ``(raw − score_min) / (score_max − score_min)`` in [0, 1];
        False keeps the raw score. Default True.
    max_tokens (int): answer length cap (room for the judge's reasoning). Default 512.
    temperature (float): sampling temperature of the judge. Default 0.
    extra_body (dict): more request fields, e.g. ``{"top_p": 1.0}`` or vLLM's ``chat_template_kwargs``;
        it may not set model, messages, max_tokens or temperature. Default empty.
    """

    model: str = ""
    prompt_template: str = DEFAULT_TEMPLATE
    system_prompt: str = ""
    parser: str = "regex"
    score_pattern: str = DEFAULT_PATTERN
    json_field: str = "score"
    score_min: float = 0.0
    score_max: float = 10.0
    normalize: bool = True
    max_tokens: int = 512
    temperature: float = 0.0
    extra_body: dict = field(default_factory=dict)

    def __post_init__(self):
        super().__post_init__()
        if not self.model:
            raise ValueError("model must name the served VLM, got ''")
        if "{prompt}" not in self.prompt_template:
            raise ValueError("prompt_template must contain '{prompt}' (where the sample's prompt goes)")
        if self.parser not in PARSERS:
            raise ValueError(f"parser must be one of {PARSERS}, got {self.parser!r}")
        if self.parser == "regex":
            import re

            try:
                re.compile(self.score_pattern)
            except re.error as e:
                raise ValueError(
                    f"score_pattern is not a valid regular expression ({e}): {self.score_pattern!r}"
                ) from e
        if not self.score_min < self.score_max:
            raise ValueError(f"score_min must be < score_max, got {self.score_min} / {self.score_max}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        clashes = sorted(set(self.extra_body) & set(_OWN_KEYS))
        if clashes:
            raise ValueError(f"extra_body may not set {clashes}: they are scorer parameters of their own")


def image_part(image: torch.Tensor) -> dict:
    """An OpenAI ``image_url`` content part carrying a uint8 ``[3, H, W]`` image as a PNG data URL."""
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + image_to_png_base64(image)}}


@register_scorer("vlm_judge")
class VlmJudgeScorer(Scorer):
    """A VLM's grade of the (edited) image for its instruction. Range [0, 1] (raw with ``normalize: false``)."""

    params_cls = VlmJudgeParams
    per_sample = True
    # the registered name, in errors; a judge with its own prompt and parsing (``unified_reward``) sets its own
    judge_name: ClassVar[str] = "vlm_judge"

    def __init__(self, params: VlmJudgeParams):
        super().__init__(params)
        self.client = HttpClient(params, scorer=self.judge_name)
        self.endpoint = params.url.rstrip("/") + "/chat/completions"

    async def score(self, batch: ScoreBatch) -> list[float]:
        sources = batch.sources or [[] for _ in range(len(batch))]
        samples = zip(batch.images, batch.prompts, sources, strict=True)
        return list(await asyncio.gather(*(self.judge(image, prompt, srcs) for image, prompt, srcs in samples)))

    def request(self, image: torch.Tensor, prompt: str, sources: list[torch.Tensor]) -> dict:
        """The chat-completions request judging ``image`` (after ``sources``) for ``prompt``."""
        p = self.params
        content = [image_part(src) for src in sources] + [image_part(image)]
        content.append({"type": "text", "text": p.prompt_template.replace("{prompt}", prompt)})
        messages = [{"role": "system", "content": p.system_prompt}] if p.system_prompt else []
        messages.append({"role": "user", "content": content})
        return {
            **p.extra_body,
            "model": p.model,
            "max_tokens": p.max_tokens,
            "temperature": p.temperature,
            "messages": messages,
        }

    async def judge(self, image: torch.Tensor, prompt: str, sources: list[torch.Tensor]) -> float:
        """The normalized grade of one sample; a :class:`ScorerError` if the answer has none in range."""
        p = self.params
        answer = await self.client.post_json(
            self.endpoint, await asyncio.to_thread(self.request, image, prompt, sources)
        )
        try:
            text = answer["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError) as e:
            raise ScorerError(
                f"scorer {self.judge_name!r}: unexpected chat answer from {self.endpoint}: {answer!r:.200}"
            ) from e
        if not isinstance(text, str) or not text.strip():
            raise ScorerError(f"scorer {self.judge_name!r}: empty answer from {self.endpoint}: {answer!r:.200}")
        try:
            raw = parse_score(text, p.parser, p.score_pattern, p.json_field)
        except ScoreParseError as e:
            raise ScorerError(f"scorer {self.judge_name!r}: {e} in the answer {text[-300:]!r}") from e
        if not p.score_min <= raw <= p.score_max:
            raise ScorerError(
                f"scorer {self.judge_name!r}: score {raw} is outside [score_min, score_max] = [{p.score_min}, {p.score_max}] "
                f"in the answer {text[-300:]!r}"
            )
        return (raw - p.score_min) / (p.score_max - p.score_min) if p.normalize else raw

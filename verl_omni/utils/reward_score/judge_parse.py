"""Reading a numeric grade out of a judge model's free-text answer (used by ``vlm_judge``).

Parsers, chosen by name:

* ``regex``: the last match of a pattern; the raw score is the mean of its capture groups (the
  whole match when the pattern has none). One group covers ``Score: 7``; several average a judge
  that grades several axes in one answer (e.g. alignment, coherence, style).
* ``last_number``: the last number in the answer (so ``7/10`` reads 10: use ``regex`` for that form).
* ``json``: the answer's JSON object (the whole answer, a fenced code block, or the span from the
  first ``{`` to the last ``}``); the value at a dotted field path, a number or a list of numbers
  (averaged, as judges returning one score per criterion do).

Every failure raises :class:`ScoreParseError` saying what was missing.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

logger = logging.getLogger(__name__)

PARSERS = ("regex", "last_number", "json")
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")
_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


class ScoreParseError(ValueError):
    """The answer holds no score of the expected form."""


def parse_score(text: str, parser: str, pattern: str = "", field: str = "score") -> float:
    """The raw score in ``text`` read by ``parser`` (``pattern`` for regex, ``field`` for json)."""
    if parser == "regex":
        return _from_regex(text, pattern)
    if parser == "last_number":
        numbers = _NUMBER.findall(text)
        if not numbers:
            raise ScoreParseError("no number")
        return float(numbers[-1])
    if parser == "json":
        return _from_json(text, field)
    raise ValueError(f"unknown score parser {parser!r}; choose one of {PARSERS}")


def _from_regex(text: str, pattern: str) -> float:
    matches = list(re.finditer(pattern, text))
    if not matches:
        raise ScoreParseError(f"no match of score_pattern {pattern!r}")
    last = matches[-1]
    groups = [g for g in last.groups() if g is not None] if last.re.groups else [last.group(0)]
    try:
        values = [float(g) for g in groups]
    except ValueError as e:
        raise ScoreParseError(f"score_pattern {pattern!r} matched {last.group(0)!r}, which is not a number") from e
    if not values:
        raise ScoreParseError(f"score_pattern {pattern!r} matched {last.group(0)!r} with no group captured")
    return sum(values) / len(values)


def _json_object(text: str) -> Any:
    candidates = [text, *_FENCE.findall(text)]
    if "{" in text:
        candidates.append(text[text.index("{") : text.rindex("}") + 1] if "}" in text else "")
    for candidate in candidates:
        try:
            return json.loads(candidate)
        except ValueError:
            continue
    raise ScoreParseError("no JSON object")


def _from_json(text: str, field: str) -> float:
    value = _json_object(text)
    for key in field.split("."):
        if not isinstance(value, dict) or key not in value:
            raise ScoreParseError(f"no field {field!r} in the JSON object")
        value = value[key]
    values = value if isinstance(value, list) else [value]
    if not values or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        raise ScoreParseError(f"field {field!r} is {value!r}, not a number or a list of numbers")
    return float(sum(values) / len(values))

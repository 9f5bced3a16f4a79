"""``geneval`` and ``geneval_server``: GenEval's compositional checks on an object detector's detections.

GenEval (Ghosh et al. 2023; the authors' ``evaluation/evaluate_images.py``) asks a detector which
objects an image shows and checks them against the prompt's metadata. The detector (and the CLIP
colour classifier) is ``_env_scripts/geneval_detector.py``; it runs

- for ``geneval``, in a child process of the scorer, in the scorer's own environment (``own_env.py``;
  its own transformers and pillow, the trainer's torch): no server to start;
- for ``geneval_server``, in a reward server the user runs (``examples/reward_servers/geneval_server.py``,
  the same code behind HTTP), to which the scorer posts the images with the HTTP scorer's retry and
  error rules.

Both ask with the same options and get the same JSON detections back; this module computes the checks
from them, so the rules have one home whichever way the detections come.

Two names, not one with "``url`` or ``detector``": each name's params are complete on their own (the
server's need ``url``, the local one the two model directories), and what a scorer needs (its own
environment, or a server) is a fact of its class, which the preflight and the scorer table read.

Per sample, the metadata is the ground truth (``batch.targets``): a JSON object in GenEval's
``evaluation_metadata.jsonl`` form, ``{"tag": ..., "include": [{"class", "count", "color"?,
"position"?: [relation, index]}], "exclude": [{"class", "count"}]}``. The rules, as GenEval
applies them:

- detections of a class scoring above ``threshold`` (``counting_threshold`` when the tag is
  ``counting``) are kept, most confident first, at most ``max_objects``; greedy suppression of
  boxes overlapping a kept one by IoU ≥ ``nms_iou`` (1.0 = off, GenEval's default);
- an ``include`` clause passes when at least ``count`` objects of its class are kept and, on the
  ``count`` most confident: at least ``count`` have the asked ``color``, and every one stands in
  the asked ``position`` relation to every object of the include clause it refers to (which must
  itself have passed);
- an ``exclude`` clause passes when fewer than ``count`` objects of its class are kept;
- position: with box centres c and sizes d, offset o = c_a − c_b is shrunk per axis by
  ``position_threshold`` × (d_a + d_b) towards 0; no relation if both parts are below 1e-3; else
  with (dx, dy) = shrunk / ‖o‖, "left of" dx < −0.5, "right of" dx > 0.5, "above" dy < −0.5,
  "below" dy > 0.5 (image y grows downwards).

Score (``params.reward``): ``strict`` is 1.0 when every clause passes, else 0.0 (GenEval's
``correct``); ``fraction`` is the share of clauses that pass.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from dataclasses import dataclass
from typing import Any, ClassVar

from verl.base_config import BaseConfig

from verl_omni.utils.reward_score._env_scripts.geneval_detector import GENEVAL_COLORS
from verl_omni.utils.reward_score.base import ScoreBatch, Scorer, ScorerError
from verl_omni.utils.reward_score.http_client import HttpClient, HttpParams, image_to_png_base64
from verl_omni.utils.reward_score.local_files import require_dir, require_file
from verl_omni.utils.reward_score.own_env import SCRIPTS_DIR, OwnEnvironmentScorer
from verl_omni.utils.reward_score.registry import register_scorer

logger = logging.getLogger(__name__)

RELATIONS = ("left of", "right of", "above", "below")
REWARD_MODES = ("strict", "fraction")


@dataclass
class GenEvalChecks(BaseConfig):
    """Args (the checks', both scorers):
    threshold (float): minimum detection score kept. Default 0.3 (GenEval's).
    counting_threshold (float): the same for prompts tagged ``counting``. Default 0.9 (GenEval's).
    max_objects (int): most confident detections kept per class. Default 16 (GenEval's).
    nms_iou (float): drop a box overlapping a more confident one of its class by IoU ≥ this; 1.0 = off. Default 1.0.
    position_threshold (float): share of the two boxes' sizes an offset must exceed. Default 0.1 (GenEval's).
    reward (str): ``strict`` (1 if every clause passes, else 0) or ``fraction`` (share passing). Default ``strict``.
    batch_size (int): images per detector call. Default 8.
    """

    threshold: float = 0.3
    counting_threshold: float = 0.9
    max_objects: int = 16
    nms_iou: float = 1.0
    position_threshold: float = 0.1
    reward: str = "strict"
    batch_size: int = 8

    def __post_init__(self):
        for name in ("threshold", "counting_threshold", "position_threshold"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if not 0.0 < self.nms_iou <= 1.0:
            raise ValueError(f"nms_iou must be in (0, 1], got {self.nms_iou}")
        if self.max_objects < 1 or self.batch_size < 1:
            raise ValueError(f"max_objects and batch_size must be >= 1, got {self.max_objects}, {self.batch_size}")
        if self.reward not in REWARD_MODES:
            raise ValueError(f"reward must be one of {REWARD_MODES}, got {self.reward!r}")


DETECTOR_WHAT = "an object detector that transformers' AutoModelForObjectDetection loads (config.json)"
CLIP_WHAT = "a CLIPModel + CLIPProcessor checkpoint (config.json)"


@dataclass
class GenEvalParams(GenEvalChecks):
    """Args (besides :class:`GenEvalChecks`):
    detector (str): local directory of a COCO object detector that transformers' ``AutoModelForObjectDetection``
        and ``AutoImageProcessor`` load (its ``id2label`` names are GenEval's class names), e.g. DETR. Required.
    clip (str): local ``CLIPModel`` + ``CLIPProcessor`` directory for the colours (GenEval: OpenAI's ViT-L/14).
        Required.
    device (str): torch device of both models in the scorer's process. Default ``cpu``.
    """

    # the checkpoint directories, for the scorer table's "needs" column
    weight_fields: ClassVar[tuple[str, ...]] = ("detector", "clip")
    # what a config written for the served detector (this scorer's parameters before it ran the detector itself)
    # is told
    moved_parameters: ClassVar[dict[str, str]] = {
        "url": "a served detector is the scorer geneval_server (type: geneval_server, params.url); geneval runs "
        "the detector itself from params.detector and params.clip"
    }

    detector: str = ""
    clip: str = ""
    device: str = "cpu"

    def __post_init__(self):
        super().__post_init__()
        for name, what in (("detector", DETECTOR_WHAT), ("clip", CLIP_WHAT)):
            if not getattr(self, name):
                raise ValueError(f"{name} must name a local directory holding {what}, got ''")


@dataclass
class GenEvalServerParams(HttpParams, GenEvalChecks):
    """Args: :class:`HttpParams` (``url`` is the server's ``/detect`` endpoint) and :class:`GenEvalChecks`."""

    def __post_init__(self):
        HttpParams.__post_init__(self)
        GenEvalChecks.__post_init__(self)


@dataclass(frozen=True)
class Detection:
    """One detected object: ``box`` (x1, y1, x2, y2) in pixels, ``score``, ``color`` (when classified)."""

    box: tuple[float, float, float, float]
    score: float
    color: str | None = None


def box_iou(a, b) -> float:
    """IoU with GenEval's inclusive pixel convention (a side spans x2 − x1 + 1 pixels)."""

    def area(box):
        return max(box[2] - box[0] + 1, 0) * max(box[3] - box[1] + 1, 0)

    inter = area((max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])))
    union = area(a) + area(b) - inter
    return inter / union if union else 0.0


def keep_detections(found: list[Detection], threshold: float, max_objects: int, nms_iou: float) -> list[Detection]:
    """Detections above ``threshold``, most confident first, at most ``max_objects``, then greedy NMS."""
    ranked = sorted((d for d in found if d.score > threshold), key=lambda d: -d.score)[:max_objects]
    kept: list[Detection] = []
    while ranked:
        best = ranked.pop(0)
        kept.append(best)
        if nms_iou < 1.0:
            ranked = [d for d in ranked if box_iou(best.box, d.box) < nms_iou]
    return kept


def relative_position(a, b, position_threshold: float) -> set[str]:
    """The relations of box ``a`` to box ``b`` (module docstring, "position")."""
    center_a = ((a[0] + a[2]) / 2, (a[1] + a[3]) / 2)
    center_b = ((b[0] + b[2]) / 2, (b[1] + b[3]) / 2)
    size_a, size_b = (abs(a[2] - a[0]), abs(a[3] - a[1])), (abs(b[2] - b[0]), abs(b[3] - b[1]))
    offset = [ca - cb for ca, cb in zip(center_a, center_b, strict=True)]
    shrunk = [
        math.copysign(max(abs(o) - position_threshold * (sa + sb), 0.0), o)
        for o, sa, sb in zip(offset, size_a, size_b, strict=True)
    ]
    if all(abs(s) < 1e-3 for s in shrunk):
        return set()
    norm = math.hypot(*offset)
    dx, dy = shrunk[0] / norm, shrunk[1] / norm
    relations = set()
    if dx < -0.5:
        relations.add("left of")
    if dx > 0.5:
        relations.add("right of")
    if dy < -0.5:
        relations.add("above")
    if dy > 0.5:
        relations.add("below")
    return relations


def check_metadata(metadata: Any, where: str) -> dict:
    """Validate one sample's GenEval metadata; errors name ``where`` (the sample) and the bad clause."""
    if isinstance(metadata, str):
        try:
            metadata = json.loads(metadata)
        except ValueError as e:
            raise ValueError(f"{where}: GenEval metadata must be JSON, got {metadata!r:.200}") from e
    if not isinstance(metadata, dict) or not (metadata.get("include") or metadata.get("exclude")):
        raise ValueError(f"{where}: GenEval metadata needs 'include' and/or 'exclude' clauses, got {metadata!r:.200}")
    includes = metadata.get("include", [])
    for i, clause in enumerate(includes + metadata.get("exclude", [])):
        if not isinstance(clause.get("class"), str) or not isinstance(clause.get("count"), int) or clause["count"] < 1:
            raise ValueError(f"{where}: clause {clause!r} needs a 'class' string and a 'count' >= 1")
        if "color" in clause and clause["color"] not in GENEVAL_COLORS:
            raise ValueError(f"{where}: color {clause['color']!r} is not one of {GENEVAL_COLORS}")
        if "position" in clause:
            relation, target = clause["position"]
            if relation not in RELATIONS or not isinstance(target, int) or not 0 <= target < min(i, len(includes)):
                raise ValueError(
                    f"{where}: position {clause['position']!r} needs one of {RELATIONS} and the index of an "
                    "earlier include clause"
                )
    return metadata


def evaluate_clauses(metadata: dict, detections: dict[str, list[Detection]], params: GenEvalParams) -> list[bool]:
    """Pass/fail of every clause (includes, then excludes) of validated ``metadata``.

    ``detections`` maps a class name to its raw detections (any order, any score); they are
    filtered here with the thresholds of ``params``.
    """
    threshold = params.counting_threshold if metadata.get("tag") == "counting" else params.threshold
    kept = {
        name: keep_detections(found, threshold, params.max_objects, params.nms_iou)
        for name, found in detections.items()
    }
    results: list[bool] = []
    groups: list[list[Detection] | None] = []
    for clause in metadata.get("include", []):
        objects = kept.get(clause["class"], [])[: clause["count"]]
        passed = len(objects) >= clause["count"]
        if passed and "color" in clause:
            passed = sum(d.color == clause["color"] for d in objects) >= clause["count"]
        if passed and "position" in clause:
            relation, target = clause["position"]
            targets = groups[target]
            passed = targets is not None and all(
                relation in relative_position(d.box, t.box, params.position_threshold) for d in objects for t in targets
            )
        groups.append(objects if passed else None)
        results.append(passed)
    for clause in metadata.get("exclude", []):
        results.append(len(kept.get(clause["class"], [])) < clause["count"])
    return results


def parse_detections(answer: Any, where: str, scorer: str = "geneval") -> dict[str, list[Detection]]:
    """One image's server answer ``{class: [{"box": [4], "score": s, "color": c?}]}`` as detections."""
    if not isinstance(answer, dict):
        raise ScorerError(f"scorer {scorer!r}: {where} must be an object of class → detections, got {answer!r:.200}")
    try:
        return {
            name: [Detection(tuple(float(v) for v in d["box"]), float(d["score"]), d.get("color")) for d in found]
            for name, found in answer.items()
        }
    except (KeyError, TypeError, ValueError) as e:
        raise ScorerError(f"scorer {scorer!r}: malformed detections in {where}: {answer!r:.200}") from e


def detection_options(metadata: list[dict], params: GenEvalChecks) -> dict:
    """The detector's options for the images of ``metadata``: colours of the classes a clause asks a colour of,
    every detection the thresholds may keep (the request schema in ``_env_scripts/geneval_detector.py``)."""
    return {
        "color_classes": [sorted({c["class"] for c in m.get("include", []) if "color" in c}) for m in metadata],
        "min_score": min(params.threshold, params.counting_threshold),
        "max_objects": params.max_objects,
    }


def check_answer(found: Any, count: int, source: str, scorer: str) -> list[dict[str, list[Detection]]]:
    """The detector's answer for ``count`` images (a list of per-image detections) as detections."""
    if not isinstance(found, list) or len(found) != count:
        raise ScorerError(f"scorer {scorer!r}: {source} must answer {count} per-image detections, got {found!r:.200}")
    return [parse_detections(a, f"detections[{k}] from {source}", scorer) for k, a in enumerate(found)]


def metadata_of(batch: ScoreBatch) -> list[dict]:
    targets = batch.targets or [None] * len(batch)
    return [check_metadata(t, f"geneval metadata of sample {i} (the ground truth)") for i, t in enumerate(targets)]


def chunks(size: int, batch_size: int) -> list[range]:
    return [range(start, min(start + batch_size, size)) for start in range(0, size, batch_size)]


def scores_of(metadata: list[dict], detections: list[dict[str, list[Detection]]], params: GenEvalChecks) -> list:
    """GenEval's score (``params.reward``) of each sample from its metadata and raw detections."""
    scores = []
    for meta, found in zip(metadata, detections, strict=True):
        results = evaluate_clauses(meta, found, params)
        scores.append(float(all(results)) if params.reward == "strict" else sum(results) / len(results))
    return scores


@register_scorer("geneval")
class GenEvalScorer(OwnEnvironmentScorer):
    """GenEval's object/count/colour/position checks on the detections of a local detector. Range [0, 1].

    The detector runs in a child process in the scorer's own environment (module docstring); torch comes from
    the trainer's environment.
    """

    params_cls = GenEvalParams
    requirements = ("transformers==5.10.4", "pillow==13.0.0")
    inherit = True
    script = SCRIPTS_DIR / "geneval_detector.py"

    def __init__(self, params: GenEvalParams):
        super().__init__(params)
        # in the reward worker, before the child starts: a missing directory is named here, not in its traceback
        require_file(require_dir(params.detector, "detector", DETECTOR_WHAT), "config.json", "detector", DETECTOR_WHAT)
        require_file(require_dir(params.clip, "clip", CLIP_WHAT), "config.json", "clip", CLIP_WHAT)

    def script_args(self) -> list[str]:
        p = self.params
        return ["--detector", p.detector, "--clip", p.clip, "--device", p.device]

    def detect(self, images, metadata: list[dict]) -> list[dict[str, list[Detection]]]:
        """The raw detections of ``images`` (uint8 ``[B, 3, H, W]``) from the child."""
        found = self.request(images, [""] * len(images), None, detection_options(metadata, self.params))
        return check_answer(found, len(images), f"the detector in {self.environment().path()}", "geneval")

    def score_sync(self, batch: ScoreBatch) -> list[float]:
        metadata = metadata_of(batch)
        detections = []
        for chunk in chunks(len(batch), self.params.batch_size):
            detections += self.detect(batch.images[chunk.start : chunk.stop], metadata[chunk.start : chunk.stop])
        return scores_of(metadata, detections, self.params)


@register_scorer("geneval_server")
class GenEvalServerScorer(Scorer):
    """GenEval's object/count/colour/position checks on the detections of a served detector. Range [0, 1]."""

    params_cls = GenEvalServerParams

    def __init__(self, params: GenEvalServerParams):
        super().__init__(params)
        self.client = HttpClient(params, scorer="geneval_server")

    async def score(self, batch: ScoreBatch) -> list[float]:
        metadata = metadata_of(batch)
        answers = await asyncio.gather(
            *(self.detect(batch, c, metadata) for c in chunks(len(batch), self.params.batch_size))
        )
        return scores_of(metadata, [d for chunk in answers for d in chunk], self.params)

    async def detect(self, batch: ScoreBatch, indices: range, metadata: list[dict]) -> list[dict[str, list[Detection]]]:
        """Ask the server for the detections of the images at ``indices`` (the request schema in
        docs/guide/rewards.md)."""
        payload = {
            "images": [image_to_png_base64(batch.images[i]) for i in indices],
            **detection_options([metadata[i] for i in indices], self.params),
        }
        answer = await self.client.post_json(self.params.url, payload)
        found = answer.get("detections") if isinstance(answer, dict) else None
        return check_answer(found, len(indices), self.params.url, "geneval_server")

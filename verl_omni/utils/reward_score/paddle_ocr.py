"""Flow-GRPO's OCR reward: PaddleOCR reads each image locally, and the read text is scored against the target.

The paper's text-rendering reward (Flow-GRPO, Liu et al. 2025) is ``r = 1 - min(d, len(target)) / len(target)``
with ``d`` the edit distance between the text PaddleOCR recognizes in the image and the target text, both
lower-cased with whitespace removed; a target found inside the read text counts as ``d = 0``. The target is the
``ocr`` scorer's: the sample's ground truth, else the prompt's first quoted span; the distance is the same code.

PaddleOCR (``paddleocr`` 2.9.1 on ``paddlepaddle`` 2.6.2, the authors' versions, here the CPU wheel) pins
``numpy<2`` and cannot import into the trainer, so it runs in the scorer's own environment (:mod:`.own_env`):
the child reads the texts (``_env_scripts/paddle_ocr.py``) and the score is computed here. Nothing is downloaded:
the detection and recognition models and the recognizer's character list are local paths, the released PP-OCR
inference models (``https://paddleocr.bj.bcebos.com/PP-OCRv3/english/en_PP-OCRv3_det_infer.tar`` and
``.../PP-OCRv4/english/en_PP-OCRv4_rec_infer.tar``, unpacked; ``en_dict.txt`` from the PaddleOCR repository's
``ppocr/utils/``), the ones ``PaddleOCR(lang="en")`` fetches by default.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar

from verl.base_config import BaseConfig

from verl_omni.utils.reward_score.base import ScoreBatch, ScorerError
from verl_omni.utils.reward_score.local_files import require_dir, require_file
from verl_omni.utils.reward_score.ocr import find_target, ocr_similarity
from verl_omni.utils.reward_score.own_env import SCRIPTS_DIR, OwnEnvironmentScorer
from verl_omni.utils.reward_score.registry import register_scorer

RELEASES = "https://paddleocr.bj.bcebos.com/"
DET_WHAT = f"a PP-OCR text-detection inference model (e.g. {RELEASES}PP-OCRv3/english/en_PP-OCRv3_det_infer.tar)"
REC_WHAT = f"a PP-OCR text-recognition inference model (e.g. {RELEASES}PP-OCRv4/english/en_PP-OCRv4_rec_infer.tar)"
DICT_WHAT = "the recognizer's character list, one per line (en_dict.txt of PaddleOCR's ppocr/utils/)"
MODEL_FILES = ("inference.pdmodel", "inference.pdiparams")


@dataclass
class PaddleOcrParams(BaseConfig):
    """Args (all required, local paths; see the module docstring for the released files):
    det_model_dir (str): directory of the text-detection inference model (``inference.pdmodel``/``.pdiparams``).
    rec_model_dir (str): directory of the text-recognition inference model.
    rec_char_dict_path (str): the recognizer's character list file.
    """

    # the released files, for the scorer table's "needs" column
    weight_fields: ClassVar[tuple[str, ...]] = ("det_model_dir", "rec_model_dir", "rec_char_dict_path")

    det_model_dir: str = ""
    rec_model_dir: str = ""
    rec_char_dict_path: str = ""

    def __post_init__(self):
        for key, what in (("det_model_dir", DET_WHAT), ("rec_model_dir", REC_WHAT), ("rec_char_dict_path", DICT_WHAT)):
            if not getattr(self, key):
                raise ValueError(f"{key} must name a local path holding {what}, got ''")


def check_model_files(params: PaddleOcrParams) -> None:
    """Raise naming the key, the path and where to get it when a model directory or the dictionary is missing."""
    for key, what in (("det_model_dir", DET_WHAT), ("rec_model_dir", REC_WHAT)):
        directory = require_dir(getattr(params, key), key, what + ", unpacked")
        for name in MODEL_FILES:
            require_file(directory, name, key, what + ", unpacked")
    if not os.path.isfile(params.rec_char_dict_path):
        raise FileNotFoundError(
            f"rec_char_dict_path={params.rec_char_dict_path!r} is not a file; it must be {DICT_WHAT}"
        )


@register_scorer("paddle_ocr")
class PaddleOcrScorer(OwnEnvironmentScorer):
    """Flow-GRPO's OCR reward: 1 − min(edit distance, target length) / target length between the text PaddleOCR
    reads locally and the target (1 when the target appears in it). Range [0, 1]."""

    params_cls = PaddleOcrParams
    # paddle imports setuptools without declaring it; the OpenCV is the headless one (no libGL needed)
    requirements = (
        "paddlepaddle==2.6.2",
        "paddleocr==2.9.1",
        "opencv-python-headless==4.11.0.86",
        "setuptools==84.2.1",
    )
    # declared by paddleocr (its GUI OpenCVs would overwrite the headless cv2; the rest serve its command line,
    # PDF and plotting code) and never imported when it reads an image
    overrides = tuple(
        f"{name}; sys_platform == 'never'"
        for name in ("opencv-python", "opencv-contrib-python", "matplotlib", "cython", "fire", "fonttools")
    )
    script = SCRIPTS_DIR / "paddle_ocr.py"

    def __init__(self, params: PaddleOcrParams):
        check_model_files(params)
        super().__init__(params)

    def script_args(self) -> list[str]:
        p = self.params
        return [p.det_model_dir, p.rec_model_dir, p.rec_char_dict_path]

    def score_sync(self, batch: ScoreBatch) -> list[float]:
        ground_truths = batch.targets or [None] * len(batch)
        targets = [find_target(p, gt) for p, gt in zip(batch.prompts, ground_truths, strict=True)]
        reads = self.request(batch.images, batch.prompts, batch.targets)
        if not isinstance(reads, list) or len(reads) != len(batch):
            raise ScorerError(f"paddle_ocr's script must answer {len(batch)} texts, got {reads!r:.200}")
        return [ocr_similarity(read, t, contained_is_exact=True) for read, t in zip(reads, targets, strict=True)]

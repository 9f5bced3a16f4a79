"""Tiny random PaddleOCR models for the ``paddle_ocr`` scorer: a DB detector and a CRNN recognizer at small widths.

The directory holds ``det/`` and ``rec/`` (Paddle inference models, ``inference.pdmodel`` + ``inference.pdiparams``,
as the released PP-OCR models are unpacked) and ``en_dict.txt`` (eight characters), so ``PaddleOCR`` loads it by
the same code as the released models: the scorer's params are ``det_model_dir=<dir>/det``,
``rec_model_dir=<dir>/rec``, ``rec_char_dict_path=<dir>/en_dict.txt``. Paddle is only in the scorer's own
environment, so the networks are written and saved by a script run there
(``reward_score/_env_scripts/paddle_ocr_tiny_model.py``, which says what is set rather than drawn and why); the
environment is built first if the cache does not hold it.
"""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

logger = logging.getLogger(__name__)

SCRIPT = "paddle_ocr_tiny_model.py"


def build_tiny_paddle_ocr(out_dir: Path, seed: int = 0, dtype: str = "float32") -> Path:
    """Write the tiny PaddleOCR models to ``out_dir``; the same seed gives the same weights. float32 only."""
    from verl_omni.utils.reward_score.environment import build
    from verl_omni.utils.reward_score.own_env import SCRIPTS_DIR
    from verl_omni.utils.reward_score.paddle_ocr import PaddleOcrScorer

    if dtype != "float32":
        raise ValueError(
            f"the tiny paddle_ocr models are float32 (PaddleOCR's CPU predictor runs float32), got {dtype}"
        )
    out_dir = Path(out_dir)
    python = build(PaddleOcrScorer.environment()) / "bin" / "python"
    result = subprocess.run(
        [str(python), str(SCRIPTS_DIR / SCRIPT), str(out_dir), str(seed)], capture_output=True, text=True
    )
    if result.returncode != 0:
        raise RuntimeError(f"building the tiny paddle_ocr models failed in the scorer's environment:\n{result.stderr}")
    logger.info("tiny PaddleOCR models written to %s", out_dir)
    return out_dir

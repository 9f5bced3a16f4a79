"""Reads the text in each image with PaddleOCR, in the environment of the ``paddle_ocr`` scorer.

Usage: ``<env>/bin/python paddle_ocr.py DET_MODEL_DIR REC_MODEL_DIR REC_CHAR_DICT_PATH``; then the
``scorer_child`` protocol, its result the texts read (the scorer computes the edit-distance reward on its side).

As Flow-GRPO's reward does: detection then recognition, no angle classifier, the lines joined in PaddleOCR's
reading order (those it keeps: confidence >= its drop score 0.5, and > 0), and the image passed as the RGB array
the trainer generated (the authors pass ``numpy.array`` of a PIL image to ``ocr``). PaddleOCR downloads the angle
classifier's model whenever its directory lacks one, even unused; pointing it at the detector's directory keeps
it from the network.
"""

import os
import sys
import zlib  # noqa: F401  before paddle, whose libraries otherwise take zlib's symbols: a segfault on first use

import numpy
from paddleocr import PaddleOCR
from scorer_child import serve


def main(det_model_dir, rec_model_dir, rec_char_dict_path):
    loaded = []  # loaded in the first call, once serving: what loading prints cannot reach the protocol's stdout

    def read(data, shape, prompts, targets, extra):
        if not loaded:
            loaded.append(
                PaddleOCR(
                    det_model_dir=det_model_dir,
                    rec_model_dir=rec_model_dir,
                    rec_char_dict_path=rec_char_dict_path,
                    cls_model_dir=det_model_dir,
                    use_angle_cls=False,
                    lang="en",
                    use_gpu=False,
                    show_log=False,
                )
            )
        if len(shape) != 4 or shape[1] != 3:
            raise ValueError(f"paddle_ocr reads images [B, 3, H, W], got shape {shape}")
        images = numpy.frombuffer(data, dtype=numpy.uint8).reshape(shape).transpose(0, 2, 3, 1)
        texts = []
        for image in images:
            lines = loaded[0].ocr(numpy.ascontiguousarray(image), cls=False)[0] or []
            texts.append("".join(text for _, (text, confidence) in lines if confidence > 0))
        return texts

    serve(read)
    # input ended, the scorer is closed: skip the interpreter's teardown, which takes paddle seconds (longer than
    # the scorer waits before killing the process) and has nothing to save
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(*sys.argv[1:4])

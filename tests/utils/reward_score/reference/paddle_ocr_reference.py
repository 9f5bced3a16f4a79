"""Flow-GRPO's OCR reward computed the authors' way, for ``test_paddle_ocr.py``: run under the ``paddle_ocr``
scorer's environment, independently of the scorer (its own PaddleOCR instance, rapidfuzz's Levenshtein distance,
the published formula written out here).

Usage: ``<env>/bin/python paddle_ocr_reference.py REQUEST.json ANSWER.json`` with the request
``{"root": <tiny model dir>, "images": <.npy of uint8 [B, H, W, 3]>, "targets": [B strings]}``; the answer is
``{"reads": [...], "scores": [...]}``. The steps are the authors' (github.com/yifan123/flow_grpo,
``flow_grpo/ocr.py``): ``ocr(image, cls=False)`` on the RGB array, the recognized lines with confidence > 0
joined, spaces removed and lower case on both sides, distance 0 when the target is inside the read text, the
distance capped at the target's length, ``1 - d / len``.
"""

import json
import os
import sys
import zlib  # noqa: F401  before paddle, whose libraries otherwise take zlib's symbols: a segfault on first use

import numpy
from paddleocr import PaddleOCR
from rapidfuzz.distance import Levenshtein


def reward(read, target):
    read, target = read.replace(" ", "").lower(), target.replace(" ", "").lower()
    d = 0 if target in read else Levenshtein.distance(read, target)
    return 1 - min(d, len(target)) / len(target)


def main(request_path, answer_path):
    request = json.loads(open(request_path).read())
    root = request["root"]
    ocr = PaddleOCR(
        det_model_dir=f"{root}/det",
        rec_model_dir=f"{root}/rec",
        rec_char_dict_path=f"{root}/en_dict.txt",
        cls_model_dir=f"{root}/det",
        use_angle_cls=False,
        lang="en",
        use_gpu=False,
        show_log=False,
    )
    reads = []
    for image in numpy.load(request["images"]):
        result = ocr.ocr(image, cls=False)
        reads.append("".join(line[1][0] for line in result[0] if line[1][1] > 0) if result[0] else "")
    scores = [reward(read, target) for read, target in zip(reads, request["targets"], strict=True)]
    with open(answer_path, "w") as f:
        json.dump({"reads": reads, "scores": scores}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    os._exit(0)  # the answer is written; paddle's interpreter teardown takes seconds

"""Writes the tiny random PaddleOCR models, in the environment of the ``paddle_ocr`` scorer (paddle is only there).

Usage: ``<env>/bin/python paddle_ocr_tiny_model.py OUT_DIR SEED``. Writes ``OUT_DIR/det`` and ``OUT_DIR/rec`` as
Paddle inference models (``inference.pdmodel`` + ``inference.pdiparams``, what ``paddle.jit.save`` writes and
PaddleOCR's predictor loads) and ``OUT_DIR/en_dict.txt``, the recognizer's character list, one per line.

The pip package of PaddleOCR ships the inference code but not its model definitions, so the two networks are
written here in paddle with the published architectures' shape at small widths:

* detection, DB: a strided convolution backbone, an FPN that merges its three scales, and the DB head's
  probability branch (convolution, transposed convolution back to the input size, sigmoid): ``[N, 1, H, W]``;
* recognition, CRNN: convolutions that reduce the 48-pixel line to one row, a bidirectional LSTM along the width
  and the CTC classifier's softmax over blank + the dictionary + space: ``[N, T, classes]``.

Two weights are set, not drawn, so that the pipeline reads something: the probability branch's last bias is
large (a random detector's map sits near 0.5, below PaddleOCR's box threshold, and would find no text at all),
and the classifier's weights are scaled up (a random classifier's confidence sits below PaddleOCR's drop score
of 0.5, and every line would be dropped). The result marks the whole image as one text box and reads a string
of the dictionary's characters that depends on the pixels.
"""

import os
import pickle
import sys
import zlib  # noqa: F401  before paddle, whose libraries otherwise take zlib's symbols: a segfault on first use
from pathlib import Path

import paddle
from paddle import nn
from paddle.nn import functional

CHARACTERS = "abcdefgh"
DETECTOR_BIAS = 6.0
CLASSIFIER_SCALE = 40.0


def _conv(in_channels, out_channels, stride):
    return nn.Sequential(
        nn.Conv2D(in_channels, out_channels, 3, stride=stride, padding=1, bias_attr=False),
        nn.BatchNorm2D(out_channels),
        nn.ReLU(),
    )


class TinyDB(nn.Layer):
    """DB text detector: backbone at strides 2, 4, 8; FPN to stride 2; probability head back to stride 1."""

    def __init__(self, width=8):
        super().__init__()
        self.stages = nn.LayerList([_conv(3, width, 2), _conv(width, 2 * width, 2), _conv(2 * width, 4 * width, 2)])
        self.laterals = nn.LayerList([nn.Conv2D(c, width, 1) for c in (width, 2 * width, 4 * width)])
        self.head = nn.Sequential(_conv(3 * width, width, 1), nn.Conv2DTranspose(width, 1, 2, stride=2))

    def forward(self, x):
        features = []
        for stage in self.stages:
            x = stage(x)
            features.append(x)
        p1, p2, p3 = (self.laterals[i](features[i]) for i in range(3))  # paddle's static graph: no zip(strict=)
        p2 = p2 + functional.interpolate(p3, scale_factor=2, mode="nearest")
        p1 = p1 + functional.interpolate(p2, scale_factor=2, mode="nearest")
        fused = paddle.concat(
            [
                p1,
                functional.interpolate(p2, scale_factor=2, mode="nearest"),
                functional.interpolate(p3, scale_factor=4, mode="nearest"),
            ],
            axis=1,
        )
        return functional.sigmoid(self.head(fused))


class TinyCRNN(nn.Layer):
    """CRNN recognizer: convolutions to stride (8, 4), height averaged away, BiLSTM, CTC softmax."""

    def __init__(self, classes, width=16, hidden=16):
        super().__init__()
        self.backbone = nn.Sequential(_conv(3, width, 2), _conv(width, width, 2), _conv(width, 2 * width, (2, 1)))
        self.lstm = nn.LSTM(2 * width, hidden, direction="bidirectional")
        self.classifier = nn.Linear(2 * hidden, classes)

    def forward(self, x):
        features = self.backbone(x).mean(axis=2)  # [N, C, W/4]
        sequence, _ = self.lstm(features.transpose([0, 2, 1]))
        return functional.softmax(self.classifier(sequence), axis=-1)


def _save(model, directory):
    model.eval()
    spec = [paddle.static.InputSpec(shape=[None, 3, None, None], dtype="float32", name="x")]
    paddle.jit.save(paddle.jit.to_static(model, input_spec=spec), str(directory / "inference"))
    # the parameter-name map is pickled in an order that varies between runs: rewritten sorted, the same seed
    # gives the same bytes
    info = directory / "inference.pdiparams.info"
    info.write_bytes(pickle.dumps(dict(sorted(pickle.loads(info.read_bytes()).items())), protocol=2))


def main(out_dir, seed):
    out_dir.mkdir(parents=True, exist_ok=True)
    paddle.seed(seed)
    detector = TinyDB()
    last = detector.head[-1]
    last.bias.set_value(paddle.full_like(last.bias, DETECTOR_BIAS))
    recognizer = TinyCRNN(classes=len(CHARACTERS) + 2)  # CTC blank first, space last (PaddleOCR's decoder)
    weight = recognizer.classifier.weight
    weight.set_value(weight * CLASSIFIER_SCALE)
    _save(detector, out_dir / "det")
    _save(recognizer, out_dir / "rec")
    (out_dir / "en_dict.txt").write_text("".join(c + "\n" for c in CHARACTERS))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
    os._exit(0)  # the files are written and closed; paddle's interpreter teardown takes seconds

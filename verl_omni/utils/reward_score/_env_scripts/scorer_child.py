"""The child side of an own-environment scorer's protocol (``verl_omni/utils/reward_score/own_env.py``).

Standard library only, and nothing of ``verl_omni``: it runs under the Python of the scorer's own environment.
A scoring script calls :func:`serve` with a function of ``(images_bytes, shape, prompts, targets)`` returning
one float per sample; ``serve`` answers requests until its input ends. A script whose scorer computes the score on
the trainer's side calls :func:`serve_texts` with a function returning one string per sample instead.
"""

import json
import os
import sys
import traceback


def _read_exactly(stream, size):
    chunks = []
    while size:
        chunk = stream.read(size)
        if not chunk:
            raise EOFError("input ended inside a batch")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def serve(score):
    """Answer each request with ``{"scores": [float per sample]}``."""
    _serve(score, "scores", float)


def serve_texts(read):
    """Answer each request with ``{"texts": [str per sample]}``."""
    _serve(read, "texts", str)


def _serve(function, key, convert):
    requests = sys.stdin.buffer
    # The protocol owns stdout: from here on anything the scorer's packages write there goes to stderr, at the
    # file-descriptor level too (a C++ library's printf, a logging handler that kept the old sys.stdout). What a
    # script writes before serving is not caught: load models in the first call, not before.
    sys.stdout.flush()
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    while True:
        line = requests.readline()
        if not line:
            return
        header = json.loads(line)
        size = 1
        for side in header["shape"]:
            size *= side
        data = _read_exactly(requests, size)
        try:
            values = function(data, header["shape"], header["prompts"], header["targets"])
            answer = {key: [convert(v) for v in values]}
        except Exception:
            answer = {"error": traceback.format_exc(limit=5)}
        answers.write(json.dumps(answer).encode() + b"\n")
        answers.flush()

"""The child side of an own-environment scorer's protocol (``verl_omni/utils/reward_score/own_env.py``).

Standard library only, and nothing of ``verl_omni``: it runs under the Python of the scorer's own environment.
A script calls :func:`serve` with a function of ``(images_bytes, shape, prompts, targets, extra)`` whose return
value is any JSON value (a scorer's: one float per sample; a scorer that scores on the trainer's side: what the
child measured, e.g. the texts read or the detections); ``serve`` answers requests until its input ends.
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


def serve(function):
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
            result = function(data, header["shape"], header["prompts"], header["targets"], header.get("extra"))
            answer = json.dumps({"result": result}).encode()
        except Exception:
            answer = json.dumps({"error": traceback.format_exc(limit=5)}).encode()
        answers.write(answer + b"\n")
        answers.flush()

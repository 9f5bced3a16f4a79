"""The child side of an own-environment scorer's protocol (``verl_omni/utils/reward_score/own_env.py``).

Standard library only, and nothing of ``verl_omni``: it runs under the Python of the scorer's own environment.
A script calls :func:`serve` with a function of ``(images_bytes, shape, prompts, targets, extra)`` whose return
value is any JSON value (a scorer's: one float per sample); ``serve`` answers requests until its input ends.
"""

import json
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
    requests, answers = sys.stdin.buffer, sys.stdout.buffer
    # the protocol owns stdout: anything the scorer's packages print goes to stderr
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

"""The child side of an own-environment scorer's protocol (``verl_omni/utils/reward_score/own_env.py``).

Standard library only, and nothing of ``verl_omni``: it runs under the Python of the scorer's own environment.
A scoring script calls :func:`serve` with a function of ``(images_bytes, shape, prompts, targets)`` returning
one float per sample; ``serve`` answers requests until its input ends.
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


def serve(score):
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
            answer = {"scores": [float(s) for s in score(data, header["shape"], header["prompts"], header["targets"])]}
        except Exception:
            answer = {"error": traceback.format_exc(limit=5)}
        answers.write(json.dumps(answer).encode() + b"\n")
        answers.flush()

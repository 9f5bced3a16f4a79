"""Where a profiled request's GPU time goes, by kernel class, and how fast its matmuls and attention ran.

The FLOP-limit fraction of ``rollout_throughput.py`` says how far the rollout is from the matmul ceiling, not
why. This reads the torch profiler's chrome trace of one request (``--profile``), sums the GPU kernels' time
per class (matmul, attention, convolution, memory copies, everything else: the norms, modulation, RoPE and
activations, fused or not) and, given the FLOPs the transformer's matmuls and attention did in that request,
their achieved TFLOP/s and fraction of the measured matmul ceiling. A class's time over the request's GPU span
is its share; the span minus all kernels is the GPU idle.

Kernel names are the libraries': cuBLAS(Lt) GEMMs (``nvjet_*``, ``*gemm*``, CUTLASS), inductor's matmul
templates (``triton_tem_*mm*``), FlashAttention (``flash``, ``fmha``), cuDNN convolutions (``fprop``, ``dgrad``,
``wgrad``, ``conv``: checked before GEMMs, whose implicit-GEMM kernels they are).

    python benchmarks/kernel_profile.py OUT/profile/batched_trace.json.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from pathlib import Path

# (class, pattern) in the order tried; the first match wins
KERNEL_CLASSES = (
    ("convolution", re.compile(r"fprop|dgrad|wgrad|conv", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|attn", re.I)),
    ("matmul", re.compile(r"gemm|nvjet|cutlass|triton_tem_\w*mm|splitk", re.I)),
)
COPY_CATEGORIES = ("gpu_memcpy", "gpu_memset")


def kernel_class(name: str) -> str:
    for label, pattern in KERNEL_CLASSES:
        if pattern.search(name):
            return label
    return "other"


def load_events(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    return trace["traceEvents"] if isinstance(trace, dict) else trace


def summarize(events: list[dict]) -> dict:
    """Seconds per class over the GPU events (``cat`` kernel, memcpy, memset), the GPU span and its idle part."""
    seconds: dict[str, float] = {}
    top: dict[str, float] = {}
    start, end = float("inf"), float("-inf")
    for event in events:
        category = event.get("cat", "")
        if event.get("ph") != "X" or (category != "kernel" and category not in COPY_CATEGORIES):
            continue
        duration = float(event.get("dur", 0.0)) / 1e6
        label = "copy" if category in COPY_CATEGORIES else kernel_class(event.get("name", ""))
        seconds[label] = seconds.get(label, 0.0) + duration
        if label == "other":
            top[event["name"]] = top.get(event["name"], 0.0) + duration
        start = min(start, float(event["ts"]) / 1e6)
        end = max(end, (float(event["ts"]) + float(event.get("dur", 0.0))) / 1e6)
    if not seconds:
        raise ValueError("the trace has no GPU kernel events: was it recorded on a GPU with CUDA activities?")
    span = end - start
    busy = sum(seconds.values())
    return {
        "gpu_span_s": span,
        "kernel_s": seconds,
        "share_of_span": {label: value / span for label, value in seconds.items()},
        "idle_s": max(span - busy, 0.0),
        "top_other_kernels_s": dict(sorted(top.items(), key=lambda kv: -kv[1])[:12]),
    }


def achieved(summary: dict, tflop: dict[str, float], ceiling_tflops: float) -> dict:
    """TFLOP/s of each class given its FLOPs in the request (``tflop``: class → TFLOP), and the fraction of the
    matmul ceiling."""
    out = {}
    for label, work in tflop.items():
        seconds = summary["kernel_s"].get(label)
        if seconds:
            out[label] = {"tflops": work / seconds, "fraction_of_ceiling": work / seconds / ceiling_tflops}
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace", type=Path, help="chrome trace (.json or .json.gz) of the torch profiler")
    args = p.parse_args(argv)
    summary = summarize(load_events(args.trace))
    print(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    main()

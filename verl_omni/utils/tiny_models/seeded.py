"""Weights drawn from a seed by shape, independent of any library's initializer.

Builders whose files feed reference checks (scores compared with a reference package's own
code, ``tests/utils/reward_score/reference/``) draw every tensor here, so the bytes depend only
on the seed and the names/shapes, not on the transformers or OpenCLIP version.
"""

from __future__ import annotations

import math


def _is_norm_weight(name: str) -> bool:
    leaf = name.rsplit(".", 2)
    owner = leaf[-2].lower() if len(leaf) > 1 else ""
    return name.endswith("weight") and ("norm" in owner or owner.startswith("ln_"))


def seeded_state_dict(shapes: dict, seed: int, dtype) -> dict:
    """``{name: tensor}`` for ``{name: shape}``, drawn in sorted name order from ``seed``.

    Norm weights are near 1, biases small, other tensors ~ N(0, 1/fan_in) (fan_in = the product of
    every dim but the first, 1 for scalars and vectors).
    """
    import torch

    generator = torch.Generator().manual_seed(seed)
    out = {}
    for name in sorted(shapes):
        shape = tuple(shapes[name])
        noise = torch.randn(shape, generator=generator)
        if _is_norm_weight(name):
            value = 1.0 + 0.1 * noise
        elif name.endswith("bias"):
            value = 0.1 * noise
        else:
            value = noise / math.sqrt(max(math.prod(shape[1:]) if len(shape) > 1 else 1, 1))
        out[name] = value.to(dtype)
    return out

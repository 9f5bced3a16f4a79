"""FSDP2 units that sit out a backward without gradient sync, under mixed precision.

When FSDP2 computes in one dtype and reduces gradients in another (bf16 / fp32, the engine's default on an
accelerator) and a backward runs without gradient sync (every micro-batch but the last of a mini-batch), FSDP2's end
of backward visits every unit to upcast its accumulated gradient, reading each parameter's unsharded tensor. FSDP2
creates that tensor at the unit's first all-gather, so a unit that has never run raises ``AttributeError:
'FSDPParam' object has no attribute '_unsharded_param'``. Wan2.2 T2V-A14B meets it: a replayed window of high-noise
steps never runs the low-noise expert.

:func:`gather_every_unit_once` all-gathers and frees every unit once after sharding, so that each has the tensor
FSDP2 reads, as after any forward that ran it; the parameters and the computation are unchanged.
"""

from __future__ import annotations

import torch
from torch.distributed.fsdp import FSDPModule


def gather_every_unit_once(module: torch.nn.Module) -> int:
    """Unshard then reshard every FSDP2 unit of ``module`` (one all-gather each); returns how many."""
    units = [m for m in module.modules() if isinstance(m, FSDPModule)]
    for unit in units:
        unit.unshard()
        unit.reshard()
    return len(units)

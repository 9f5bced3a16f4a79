"""The FLOPs of one replayed sample counted without a GPU: the trained module on the ``meta`` device.

``torch.utils.flop_counter`` counts by dispatch, from shapes alone, and a ``meta`` tensor has a shape but no storage,
so the full-size transformer (FLUX.2-dev's 32 B, both A14B experts) is built and replayed on the CPU in no memory and
in seconds to minutes. ``model_throughput.py --parts flops`` prints these counts; its GPU replay falls back on them
where its own count runs out of memory (a long video: there the counter's attention path holds the L x L matrix).

What makes the count the GPU's:

* attention is counted as the GPU's fused kernels do it (``aten._scaled_dot_product_efficient_attention``, whose
  backward recomputes the scores: five matmuls), not as SDPA's math path would on ``meta`` (four, its forward's
  scores kept), so a model counted both ways gets one number;
* the recorded timesteps and the integer masks keep their values on the CPU: the A14B picks an expert by timestep,
  the SDE step looks its sigma up by it, HunyuanVideo-1.5 reorders its prompt tokens by mask; an op mixing them with
  ``meta`` tensors gets them as ``meta`` (their values are then no longer needed);
* a value read from a ``meta`` tensor (HunyuanVideo-1.5 asks whether its image stream is all zeros) reads as true,
  logged: both of that model's branches have the same shapes, so the count does not depend on it.
"""

from __future__ import annotations

import contextlib
import logging

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

logger = logging.getLogger(__name__)

META = torch.device("meta")


def fused_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
) -> torch.Tensor:
    """SDPA through the memory-efficient kernel's op (its ``meta`` kernels and FLOP formulas), a boolean mask as
    the additive bias that kernel takes."""
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        repeat = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(repeat, -3), value.repeat_interleave(repeat, -3)
    bias = attn_mask
    if bias is not None:
        if bias.dtype == torch.bool:
            bias = torch.zeros(bias.shape, dtype=query.dtype, device=query.device).masked_fill(~bias, float("-inf"))
        bias = bias.to(query.dtype).expand(*query.shape[:-1], key.shape[-2])
    out = torch.ops.aten._scaled_dot_product_efficient_attention(
        query, key, value, bias, True, dropout_p, is_causal, scale=scale
    )
    return out[0]


class MetaWithValues(TorchDispatchMode):
    """Ops on ``meta`` tensors take the CPU tensors they are mixed with as ``meta`` (indexing keeps its CPU indices,
    whose values give the result its shape); a value read from a ``meta`` tensor reads as true (logged)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._local_scalar_dense.default and args[0].is_meta:
            logger.warning("a value of a meta tensor %s was read: counted as true", tuple(args[0].shape))
            return True
        flat, _ = tree_flatten((args, kwargs))
        if func is not torch.ops.aten.index.Tensor and any(isinstance(t, torch.Tensor) and t.is_meta for t in flat):

            def to_meta(t):
                return t.to(META) if isinstance(t, torch.Tensor) and not t.is_meta and t.ndim > 0 else t

            args, kwargs = tree_map(to_meta, (args, kwargs))
        return func(*args, **kwargs)


@contextlib.contextmanager
def counting_on_meta(fused: bool = True):
    """Attention through the fused kernel's op (``fused=False``: SDPA's math path), mixed ops on ``meta``, for as long
    as the count runs. SDPA is swapped by name, not by a mode: gradient checkpointing recomputes a block where a
    torch-function mode is not active."""
    functional = torch.nn.functional
    sdpa = functional.scaled_dot_product_attention
    if fused:
        functional.scaled_dot_product_attention = fused_attention
    try:
        with MetaWithValues():
            yield
    finally:
        functional.scaled_dot_product_attention = sdpa


def meta_batch(batch_fn, module, spec, text_len: int, vae_scale_factor: int, scheduler) -> dict:
    """One recorded sample shaped as ``batch_fn`` makes it: its tensors on ``meta``, but its timesteps and integer
    masks real, on the CPU (their values pick experts, sigmas and token orders)."""
    shaped = batch_fn(module, spec, 1, text_len, vae_scale_factor, META, scheduler)
    valued = batch_fn(module, spec, 1, text_len, vae_scale_factor, torch.device("cpu"), scheduler)
    return {
        key: valued[key] if key == "all_timesteps" or not tensor.is_floating_point() else tensor
        for key, tensor in shaped.items()
    }


def count_replay_flops(
    module, scheduler, batch: dict, spec, vae_scale_factor: int, adapter, fused_attention: bool = True
) -> int:
    """FLOPs of one replayed step and its backward (``actor_throughput.fwd_bwd``, no autocast: FLOPs do not depend on
    the dtype) of ``batch`` through ``module`` on ``meta``; ``fused_attention=False``: attention as SDPA's math path
    (what a CPU's count of real tensors can be compared with: its fused kernel has no FLOP formula)."""
    from actor_throughput import fwd_bwd
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter, counting_on_meta(fused_attention):
        fwd_bwd(module, scheduler, batch, spec, vae_scale_factor, torch.float32, adapter, autocast=False)
    module.zero_grad(set_to_none=True)
    return counter.get_total_flops()

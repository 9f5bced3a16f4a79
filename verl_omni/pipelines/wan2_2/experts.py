"""The A14B's two experts as one trainable module, and the rule that keeps FSDP's ranks in step over them.

Its own module because it subclasses diffusers' ``PeftAdapterMixin``: importing diffusers costs seconds, and the
training adapters are imported by every adapter lookup (``verl_omni.pipelines.model_base``).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import torch
import torch.distributed as dist
from diffusers.loaders.peft import PeftAdapterMixin

from verl_omni.pipelines.wan2_2.training_adapter import EXPERTS


class WanExperts(PeftAdapterMixin, torch.nn.Module):
    """The A14B's experts as one trainable module: ``transformer`` denoises t >= the boundary, ``transformer_2`` below.

    It is the unit the engine builds, shards and checkpoints: diffusers' ``PeftAdapterMixin`` gives it the LoRA API
    the engine uses on a diffusers transformer (``add_adapter`` injects one adapter into both experts, so peft names
    its tensors ``transformer.<module>`` / ``transformer_2.<module>``; ``disable_adapters``, ``set_adapter``), and a
    forward goes through :meth:`forward` naming the expert, so that FSDP2's hooks on this root unshard what it owns.
    """

    def __init__(self, transformer: torch.nn.Module, transformer_2: torch.nn.Module):
        super().__init__()
        self.transformer, self.transformer_2 = transformer, transformer_2

    @property
    def config(self) -> SimpleNamespace:
        """What verl's ``apply_fsdp2`` asks of the module it shards: ``tie_word_embeddings`` (an LLM's embeddings
        shared with its head must not be sharded apart); the experts tie nothing. Each keeps its own diffusers
        ``config``."""
        return SimpleNamespace(tie_word_embeddings=False)

    def forward(self, expert: str, **kwargs):
        """``expert`` (``"transformer"`` or ``"transformer_2"``) called with ``kwargs``."""
        if expert not in EXPERTS:
            raise ValueError(f"expert={expert!r}: WanExperts holds {list(EXPERTS)}")
        return getattr(self, expert)(**kwargs)

    @staticmethod
    def caller(module: torch.nn.Module, expert: str):
        """A callable running ``expert`` of ``module``: through :meth:`forward` on a ``WanExperts`` (FSDP2's hooks),
        the attribute itself on another container of the two (a test's experts swapped)."""
        return functools.partial(module, expert) if isinstance(module, WanExperts) else getattr(module, expert)

    def enable_gradient_checkpointing(self) -> None:
        for expert in EXPERTS:
            getattr(self, expert).enable_gradient_checkpointing()


def agreed_experts(used: list[bool], device) -> list[bool]:
    """Which experts any data-parallel rank runs at this step (``used`` this rank's): every rank must run the same
    sharded modules in the same order, or FSDP's all-gathers and reduce-scatters wait forever (one process: ``used``)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return used
    flags = torch.tensor(used, dtype=torch.int32, device=device)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    return [bool(f) for f in flags.tolist()]

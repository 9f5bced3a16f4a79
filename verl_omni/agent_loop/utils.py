"""Pure helpers of the diffusion agent loop: per-sample seeds, the batched-path plan, stacking outputs.

Kept free of Ray and of the engine so that each rule is unit-tested on its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from verl_omni.workers.rollout.routing import stable_hash

# torch.Generator.manual_seed takes up to 64 bits; keep seeds non-negative int64
_SEED_MASK = (1 << 63) - 1


def sample_seed(rollout_seed: int, global_step: int, row: int) -> int:
    """The seed of batch row ``row`` at ``global_step``: a stable hash, the same in every process and run.

    A row's sample (its noise and SDE window) depends only on these three numbers, never on how
    the batch was split over workers, replicas or transformer batches.
    """
    return stable_hash(f"{int(rollout_seed)}:{int(global_step)}:{int(row)}") & _SEED_MASK


def group_noise_seeds(rows: Sequence[Mapping[str, Any]], seeds: Sequence[int], group_size: int) -> list[int]:
    """Per row, the seed of its prompt group's initial noise (``SamplingSpec.same_initial_noise``): the seed of
    the group's first row. A group is the rows sharing a ``uid`` (the trainer's prompt id), else each run of
    ``group_size`` consecutive rows; so the batched and the per-sample paths give a group one noise."""
    first: dict[Any, int] = {}
    out = []
    for i, (row, seed) in enumerate(zip(rows, seeds, strict=True)):
        key = ("uid", _plain(row["uid"])) if "uid" in row else ("run", i // max(group_size, 1))
        key = key if not isinstance(key[1], list) else (key[0], tuple(key[1]))
        out.append(first.setdefault(key, int(seed)))
    return out


def _plain(value: Any) -> Any:
    """Numpy containers as Python ones, so that two prompts compare by content."""
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


@dataclass(frozen=True)
class BatchPlan:
    """How a worker's rows are generated: groups of ``group_size`` rows (one request each), or one request per row.

    Args:
        group_size (int): rows per ``generate_batched`` request; 1 is the per-sample path.
        reason (str): why the per-sample path runs ('' when batched).
    """

    group_size: int
    reason: str = ""

    @property
    def batched(self) -> bool:
        return self.group_size > 1


def plan_batches(
    rows: Sequence[Mapping[str, Any]], n: int, *, enabled: bool, rollout_name: str, prompt_keys: Sequence[str]
) -> BatchPlan:
    """The batched path when every group of ``n`` consecutive rows can be one request; else per-sample, with the reason.

    A group can be one request when its rows have the same agent and the same values under
    ``prompt_keys`` (the prompt and the negative prompt): the request then samples ``n`` images
    of one prompt, and each image keeps its own row's seed.
    """
    if not enabled:
        return BatchPlan(1, "actor_rollout_ref.rollout.enable_batched_diffusion is False")
    if n <= 1:
        return BatchPlan(1, f"rollout.n={n}: there is no group to batch")
    if rollout_name != "vllm_omni":
        return BatchPlan(1, f"rollout.name={rollout_name!r} has no generate_batched (needs 'vllm_omni')")
    if len(rows) % n:
        return BatchPlan(1, f"the batch of {len(rows)} rows does not divide into groups of rollout.n={n}")
    for start in range(0, len(rows), n):
        group = rows[start : start + n]
        for key in ("agent_name", *prompt_keys):
            first = _plain(group[0].get(key))
            if any(_plain(row.get(key)) != first for row in group[1:]):
                return BatchPlan(1, f"rows {start}..{start + n - 1} differ in {key!r}: a group must share one prompt")
    return BatchPlan(n)


def chunk_bounds(num_rows: int, group_size: int, num_chunks: int) -> list[tuple[int, int]]:
    """``(start, end)`` of at most ``num_chunks`` contiguous, balanced chunks that never cut a group of ``group_size``.

    A batch that does not divide into groups is split row by row (its rows then take the per-sample path).
    """
    if num_rows % group_size:
        group_size = 1
    num_groups = num_rows // group_size
    num_chunks = max(1, min(num_chunks, num_groups))
    bounds = [group_size * (num_groups * i // num_chunks) for i in range(num_chunks + 1)]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def right_pad(tensors: Sequence[torch.Tensor], length: int | None = None) -> torch.Tensor:
    """Stack ``[L_i, ...]`` tensors into ``[B, L, ...]``, zero-padding dim 0 of each up to ``length`` (default: max L_i)."""
    length = max(t.shape[0] for t in tensors) if length is None else length
    out = tensors[0].new_zeros((len(tensors), length, *tensors[0].shape[1:]))
    for i, t in enumerate(tensors):
        out[i, : t.shape[0]] = t
    return out


def sequence_keys(batch, keys: Sequence[str]) -> list[str]:
    """The ``keys`` of a TensorDict whose tensors are per-token sequences ``[B, L, ...]``: embeddings
    (``[B, L, D]``), masks (``*_mask``) and what a mask goes with (token ids ``[B, L]`` beside
    ``<key>_mask``). Anything else ``[B, D]`` is one vector per sample (a pooled text embedding, SD3.5's
    and FLUX.1's ``pooled_prompt_embeds``): padding its ``D`` would feed the transformer a wrong width."""
    present = [k for k in keys if k in batch.keys()]
    return [k for k in present if batch[k].ndim >= 3 or k.endswith("_mask") or f"{k}_mask" in present]


def pad_conditioning_to(batch, keys: Sequence[str], length: int) -> None:
    """Zero-pad the ``[B, L, ...]`` sequences under ``keys`` (prompt embeddings or token ids and their masks,
    :func:`sequence_keys`) of a TensorDict to ``L = length``, in place; absent keys and vectors are skipped."""
    for key in sequence_keys(batch, keys):
        if batch[key].shape[1] < length:
            batch[key] = right_pad(list(batch[key]), length)


def pad_conditioning_alike(batches: Sequence, keys: Sequence[str]) -> None:
    """Zero-pad each recorded sequence under ``keys`` (a key with its ``<key>_mask``, :func:`sequence_keys`) of every
    TensorDict in ``batches`` to that sequence's longest over them, in place, so that the batches concatenate. One
    sequence's length does not pad another's: an editing model's image tokens are no prompt length."""
    groups: dict[str, list[str]] = {}
    for batch in batches:
        for key in sequence_keys(batch, keys):
            members = groups.setdefault(key.removesuffix("_mask"), [])
            if key not in members:
                members.append(key)
    for members in groups.values():
        length = max(b[k].shape[1] for b in batches for k in members if k in b.keys())
        for batch in batches:
            pad_conditioning_to(batch, members, length)


def one_row_array(value: Any) -> np.ndarray:
    """A length-1 object array holding ``value`` as is (``np.array([messages])`` would make it 2-D)."""
    array = np.empty(1, dtype=object)
    array[0] = value
    return array

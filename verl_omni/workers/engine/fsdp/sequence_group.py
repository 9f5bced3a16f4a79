"""The samples of a sequence-parallel group, for the replay's Ulysses split (``actor.ulysses_sequence_parallel_size``).

The worker hands each rank its own share of a batch, as without sequence parallelism. The ranks of one group
then pool their shares (:func:`gather_group_batch`): every rank of the group replays the same samples, each on
its slice of their tokens (:mod:`verl_omni.pipelines.sequence_parallel`), and keeps the outputs of its own rows
(:func:`own_rows`). Pooling in the engine leaves the worker's dispatch and the actor's mini-batching unchanged.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from tensordict import TensorDict

SEQUENCE_PARALLEL_KEY = "actor_rollout_ref.actor.ulysses_sequence_parallel_size"


def check_sequence_parallel(
    adapter,
    model_path: str,
    degree: int,
    gpus_per_node: int | None = None,
    *,
    key: str = SEQUENCE_PARALLEL_KEY,
    splits: bool | None = None,
    devices: str = "GPUs per node (trainer.n_gpus_per_node)",
) -> None:
    """Refuse a degree the model cannot run: a model that cannot split, a degree that does not divide its attention
    heads or (when given) the GPUs of a node; the message names the key, the model and the allowed degrees.

    The rollout's degree is checked here too: ``key`` is its key, ``splits`` whether its engine's transformer can
    split (default: the replay's ``adapter.supports_sequence_parallel``) and ``devices`` names what
    ``gpus_per_node`` counts."""
    if not isinstance(degree, int) or isinstance(degree, bool) or degree < 1:
        raise ValueError(f"{key} must be an integer >= 1, got {degree!r}")
    if degree == 1:
        return
    model = f"{adapter.__name__} ({model_path})"
    if not (adapter.supports_sequence_parallel if splits is None else splits):
        raise ValueError(f"{key}={degree}: {model} cannot split its sequence over ranks; allowed degrees: [1]")
    heads = adapter.attention_heads(model_path)
    limit = heads if gpus_per_node is None else min(heads, gpus_per_node)
    allowed = [d for d in range(1, limit + 1) if heads % d == 0 and (gpus_per_node is None or gpus_per_node % d == 0)]
    if degree not in allowed:
        per_node = "" if gpus_per_node is None else f" and the {gpus_per_node} {devices}"
        raise ValueError(
            f"{key}={degree} must divide the {heads} attention heads of {model}{per_node}; allowed degrees: {allowed}"
        )


def gather_group_batch(data: TensorDict, group) -> tuple[TensorDict, slice]:
    """The rows of every rank of ``group`` in rank order (non-tensor entries as this rank's), and the slice of them
    that is this rank's own."""
    tensors = {key: data.get(key) for key in data.keys() if isinstance(data.get(key), torch.Tensor)}
    parts: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(parts, {key: value.cpu() for key, value in tensors.items()}, group=group)
    sizes = [next(iter(part.values())).shape[0] for part in parts]
    rank = dist.get_rank(group)
    start = sum(sizes[:rank])
    pooled = TensorDict(
        {key: torch.cat([part[key] for part in parts]) for key in tensors},
        batch_size=[sum(sizes)],
    )
    for key in data.keys():
        if key not in tensors:
            pooled.set_non_tensor(key, data.get_non_tensor(key))
    return pooled, slice(start, start + sizes[rank])


def agree_rng_state(group) -> None:
    """Give every rank of ``group`` the random state of its first rank (host and accelerator): a replay that draws
    noise for a sample (the forward-noised steps of an ODE record) must draw the same on every rank splitting it."""
    states = [torch.get_rng_state(), torch.cuda.get_rng_state() if torch.cuda.is_available() else None]
    dist.broadcast_object_list(states, src=dist.get_global_rank(group, 0), group=group)
    torch.set_rng_state(states[0])
    if states[1] is not None:
        torch.cuda.set_rng_state(states[1])


def own_rows(outputs: dict[str, torch.Tensor], rows: slice) -> dict[str, torch.Tensor]:
    """This rank's rows of the group's replay outputs."""
    return {key: value[rows] for key, value in outputs.items()}

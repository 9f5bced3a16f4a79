"""The separate-pools asynchronous mode's data bookkeeping (the end-to-end run is ``test_flowgrpo_async_e2e.py``)."""

from __future__ import annotations

import pytest
from torchdata.stateful_dataloader import StatefulDataLoader


def loader(seed: int = 0) -> StatefulDataLoader:
    import torch

    return StatefulDataLoader(
        list(range(10)), batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(seed), drop_last=True
    )


def batches(dataloader):
    """The trainer's endless stream over epochs (``RayFlowGRPOTrainer._train_batches``)."""
    while True:
        yield from dataloader


def as_list(batch) -> list[int]:
    return batch.tolist()


def resumed_from(state: dict, count: int) -> list[list[int]]:
    """The first ``count`` batches a resumed run draws: a fresh loader, the saved state, the trainer's stream."""
    dataloader = loader()
    dataloader.load_state_dict(state)
    return [as_list(b) for b, _ in zip(batches(dataloader), range(count), strict=False)]


@pytest.mark.parametrize("ahead", [1, 2, 4])
def test_lookahead_checkpoint_resumes_where_the_sync_trainer_would_not_after_the_batches_drawn_ahead(ahead):
    """A run that drew ``ahead`` batches beyond the one it trained on saves the position the sync trainer saves
    after that batch (5 batches per epoch: also across an epoch boundary)."""
    from verl_omni.trainer.diffusion.async_mode import Lookahead

    reference = batches(loader())
    expected = [as_list(next(reference)) for _ in range(12)]
    for consumed in (1, 3, 5, 7):
        sync_loader = loader()
        sync_stream = batches(sync_loader)
        for _ in range(consumed):
            next(sync_stream)
        sync_state = sync_loader.state_dict()

        dataloader = loader()
        stream = Lookahead(batches(dataloader), dataloader)
        got = [as_list(next(stream)) for _ in range(consumed)]
        peeked = [as_list(stream.peek(i)) for i in range(ahead)]
        assert got == expected[:consumed] and peeked == expected[consumed : consumed + ahead]
        assert dataloader.state_dict() != sync_state, "drawing ahead moved the loader"
        state = stream.state_after(consumed)
        assert resumed_from(state, 4) == resumed_from(sync_state, 4)
        if consumed < 5:
            # inside the first epoch a resume draws the very next batch (a new epoch's order is the loader's affair)
            assert resumed_from(state, 1) == [expected[consumed]]
        # the stream itself goes on with the first batch peeked at
        assert as_list(next(stream)) == expected[consumed]

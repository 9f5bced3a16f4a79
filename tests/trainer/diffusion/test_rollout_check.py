"""The bypass check's sample (``actor.rollout_log_prob_check_per_prompt``): which rows it replays, and the request
the actor's worker group splits over its ranks."""

import numpy as np
import pytest
import torch
from verl import DataProto
from verl.protocol import unpad_dataproto

from verl_omni.trainer.diffusion.rollout_check import check_request, check_rows

# three prompt groups of two rows, as the rollout returns them (interleaved), then a group whose rows are apart
UIDS = np.array(["p0", "p0", "p1", "p1", "p2", "p2", "p3", "p1", "p3"], dtype=object)


@pytest.mark.parametrize(
    ("per_prompt", "rows"),
    [(1, [0, 2, 4, 6]), (2, [0, 1, 2, 3, 4, 5, 6, 8]), (0, list(range(9)))],
)
def test_check_rows_take_the_first_rows_of_every_group_in_batch_order(per_prompt, rows):
    assert check_rows(UIDS, per_prompt).tolist() == rows


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_check_request_splits_evenly_over_the_ranks_and_unpads_to_the_rows(ranks):
    actor_input = DataProto.from_dict(
        tensors={"latents": torch.arange(9.0).reshape(9, 1)}, meta_info={"sampling_spec": "spec"}
    )
    rows = check_rows(UIDS, 1)
    request, pad = check_request(actor_input, rows, ranks)
    # what Dispatch.DP_COMPUTE_PROTO does with it: one equal chunk per rank, each keeping the meta-info
    chunks = request.chunk(ranks)
    assert {len(c) for c in chunks} == {len(request) // ranks}
    assert all(c.meta_info == {"sampling_spec": "spec"} for c in chunks)
    assert unpad_dataproto(request, pad).batch["latents"].flatten().tolist() == [0.0, 2.0, 4.0, 6.0]

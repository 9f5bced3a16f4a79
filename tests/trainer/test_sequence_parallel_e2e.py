"""``python -m verl_omni.trainer.main_flowgrpo`` with the replay split over a sequence-parallel group of 2 (CPU).

Tiny Qwen-Image with true CFG (its text split too), 2 actor ranks on one node forming one group
(``actor_rollout_ref.actor.ulysses_sequence_parallel_size=2``), the rollout colocated, 2 steps, the actor
recomputing log π_old: every step trains and syncs as the unsplit runs do, and the actor's split replay stays
within the rollout's log-probs by the bound of the unsplit runs (``LOGPROB_BOUND``).
"""

from __future__ import annotations

import math

import pytest
from trainer_helpers import LOGPROB_BOUND, check_run, run_trainer

# a trainer run starts Ray, replicas and the actor: minutes on a busy 2-core machine
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

STEPS = 2


@pytest.fixture(scope="module")
def split_run(ray_cluster, tiny_qwen_image_path, prompt_files, tmp_path_factory):
    out = tmp_path_factory.mktemp("sequence_parallel") / "run"
    records, wall = run_trainer(
        out,
        tiny_qwen_image_path,
        prompt_files,
        ray_cluster,
        f"trainer.total_training_steps={STEPS}",
        f"trainer.test_freq={STEPS}",
        "trainer.n_gpus_per_node=2",
        "trainer.colocate_rollout=true",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
        "actor_rollout_ref.rollout.true_cfg_scale=4.0",
    )
    print(f"sequence parallel 2 over 2 ranks, {STEPS} steps: {wall:.0f} s")
    return out, records


def test_split_replay_trains_syncs_and_matches_the_rollout(split_run):
    run, records = split_run
    check_run(run, records, STEPS, extra_keys=("timing_s/old_log_prob", "old_log_prob/rollout_diff_max"))
    for record in records[1:]:
        assert record["data"]["old_log_prob/rollout_diff_max"] <= LOGPROB_BOUND
        assert all(math.isfinite(v) for v in record["data"].values() if isinstance(v, float)), record["data"]

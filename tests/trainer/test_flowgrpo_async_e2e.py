"""``trainer.trainer_mode=separate_async`` end to end through the real entry point, and its resume.

``run``: the tiny Qwen-Image, 1 actor rank and 1 rollout replica, each in a resource pool of its own (two placement
groups of the session's Ray cluster), the LoRA broadcast to the rollout's worker after each update (the collective
weight transport separate pools use on GPUs, over gloo), 3 steps with ``max_staleness=2``: step 1 generates in the step (nothing
queued yet); during step 1 the rollout generates steps 2 and 3 with version 0, which the actor keeps through two
updates. Step 2 trains one version off the sampling one (staleness 1), step 3 two (staleness 2); the actor replays
each batch with the weight version that sampled it (kept on the rank) and must agree with the rollout's log-probs
to fp32 numerics, while the current policy has moved away from them. One run covers both staleness levels (a
``max_staleness=1`` run was a trainer start more of the suite's time for the step-2 case this run has too).
``resumed``: ``run`` stopped after step 2's checkpoint (step 3's files gone, the tracker at 2) and resumed: the
generation queued ahead is not in the checkpoint, so step 3 is generated again, in the step, with step 2's weights
(staleness 0).
"""

from __future__ import annotations

import shutil

import pytest
from test_flowgrpo_e2e import cluster_actors, copy_of
from trainer_helpers import LOGPROB_BOUND, by_step, lora_b_norm, run_trainer

from verl_omni.trainer.diffusion import run_dir

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

STEPS = 3
ASYNC_ARGS = (
    "trainer.trainer_mode=separate_async",
    "actor_rollout_ref.actor.use_rollout_log_probs=true",
    # stale samples: the loss weighs each by its truncated importance weight against the sampling policy (no clip)
    "actor_rollout_ref.actor.rollout_correction.loss_type=reinforce",
    f"trainer.total_training_steps={STEPS}",
    "trainer.save_freq=2",
    f"trainer.test_freq={STEPS}",
    "trainer.val_before_train=false",
    # the separate pools' GPU transport, a broadcast from actor rank 0 to the rollout workers, over gloo here
    "actor_rollout_ref.rollout.weight_transport=collective",
)
# per step: (async/staleness, async/prefetched, async/weight_version, async/kept_weight_versions) with
# max_staleness=2: steps 2 and 3 are both generated during step 1 with version 0, which the actor keeps through two
# updates (staleness 1, then 2)
EXPECTED = {1: (0.0, 0.0, 0.0, 1.0), 2: (1.0, 1.0, 0.0, 1.0), 3: (2.0, 1.0, 0.0, 0.0)}
STALENESS = "trainer.max_staleness=2"
ASYNC_KEYS = ("async/staleness", "async/prefetched", "async/weight_version", "async/kept_weight_versions")


@pytest.fixture(scope="module")
def run(ray_cluster, ray_connect, tiny_qwen_image_path, prompt_files, tmp_path_factory):
    """The run, its records and the actors it placed (earlier runs share the cluster)."""
    out = tmp_path_factory.mktemp("async") / "run"
    earlier = {a.actor_id for a in cluster_actors(ray_cluster, ray_connect)}
    records, wall = run_trainer(out, tiny_qwen_image_path, prompt_files, ray_cluster, *ASYNC_ARGS, STALENESS)
    print(f"separate_async max_staleness=2, 1 rank + 1 replica, {STEPS} steps: {wall:.0f} s")
    return out, records, [a for a in cluster_actors(ray_cluster, ray_connect) if a.actor_id not in earlier]


@pytest.fixture(scope="module")
def resumed(run, ray_cluster, tiny_qwen_image_path, prompt_files, tmp_path_factory):
    out = copy_of(run[0], tmp_path_factory, "async_resumed")
    shutil.rmtree(run_dir.step_dir(out, STEPS))
    (out / run_dir.TRACKER_FILE).write_text(str(STEPS - 1))
    records, wall = run_trainer(out, tiny_qwen_image_path, prompt_files, ray_cluster, *ASYNC_ARGS, STALENESS)
    print(f"separate_async resumed at step {STEPS - 1}, 1 step: {wall:.0f} s")
    return out, records


def test_rollout_and_actor_run_in_separate_pools(run):
    _, _, actors = run
    servers = [a for a in actors if a.class_name == "vLLMOmniHttpServer"]
    ranks = [a for a in actors if a.class_name == "DiffusionActorWorker"]
    print("placement groups:", sorted((a.class_name, a.placement_group_id) for a in servers + ranks))
    assert len(servers) == 1 and len(ranks) == 1
    assert servers[0].placement_group_id and ranks[0].placement_group_id
    assert servers[0].placement_group_id != ranks[0].placement_group_id


def check_versions_and_replay(records) -> dict:
    """The staleness and weight versions of each step, and the actor's replay of the sampling version equal to the
    rollout's log-probs while the trained policy has moved away from it; the metrics by step."""
    metrics = by_step(records)
    assert sorted(metrics) == list(range(1, STEPS + 1))
    for step, expected in EXPECTED.items():
        got = metrics[step]
        assert tuple(got[k] for k in ASYNC_KEYS) == expected, f"step {step}: {[got[k] for k in ASYNC_KEYS]}"
        assert "timing_s/rollout_wait" in got and "timing_s/old_log_prob" in got
        # the ratio's denominator is the sampling version's log-prob: the actor's replay of that version agrees
        assert got["old_log_prob/rollout_diff_max"] <= LOGPROB_BOUND
        assert got["sync/lora_modules_bound_min"] > 0
        assert got["sync/weight_group_members"] == 2, "actor rank 0 and the replica's one worker"
    # off-policy: the policy that trains (after one or two more updates) has moved away from the sampling one
    for step in (2, 3):
        assert metrics[step]["actor/logprob_diff_max"] > 10 * LOGPROB_BOUND, metrics[step]["actor/logprob_diff_max"]
    assert metrics[1]["actor/logprob_diff_max"] <= LOGPROB_BOUND, "step 1 is on-policy"
    # the loss the Hydra key chose ran in the actor: truncated weights, no ratio clip
    for step in metrics.values():
        assert 0 <= step["actor/is_truncated_frac"] <= 1 and "actor/pg_clipfrac" not in step
    return metrics


def batches_drawn(out, step: int) -> int:
    """Batches the dataloader had yielded in the checkpoint of ``step`` (one epoch is longer than the run)."""
    import torch

    return torch.load(run_dir.step_dir(out, step) / "data.pt", weights_only=False)["_num_yielded"]


def test_async_steps_train_on_earlier_weights_and_the_actor_replays_exactly_those(run):
    out, records, _ = run
    metrics = check_versions_and_replay(records)
    assert lora_b_norm(out, STEPS) > 0
    assert {"val/score/mean"} <= set(metrics[STEPS])
    assert sorted(p.name for p in out.glob("global_step_*")) == ["global_step_2", "global_step_3"]
    # step 2's checkpoint holds the data position after step 2's batch, although step 3's was drawn for the queue
    assert [batches_drawn(out, step) for step in (2, 3)] == [2, 3]


def test_resume_redoes_the_queued_generation_with_the_checkpoint_weights(run, resumed):
    _, uninterrupted, _ = run
    out, records = resumed
    assert [r["step"] for r in records] == list(range(1, STEPS + 1)), "steps 1-2 kept, step 3 appended once"
    assert by_step(records)[2] == by_step(uninterrupted)[2]
    step = by_step(records)[STEPS]
    # generated in the step with the resumed weights (version 2): on-policy, and the actor agrees with the rollout
    assert tuple(step[k] for k in ASYNC_KEYS) == (0.0, 0.0, 2.0, 0.0)
    assert step["old_log_prob/rollout_diff_max"] <= LOGPROB_BOUND
    assert step["actor/logprob_diff_max"] <= LOGPROB_BOUND
    assert run_dir.checkpoint_problem(run_dir.step_dir(out, STEPS), world_size=1) is None
    assert batches_drawn(out, STEPS) == STEPS, "the resumed run went on with the batch after step 2's"

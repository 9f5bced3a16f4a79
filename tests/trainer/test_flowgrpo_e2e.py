"""``python -m verl_omni.trainer.main_flowgrpo`` end to end on the tiny Qwen-Image over two replicas and two ranks,
its resume, and the output-directory checks: real Ray, vLLM-Omni, FSDP2, reward loop.

Trainer runs (each a subprocess of the real entry point) on the session's two-node Ray cluster
(``ray_cluster``: a head and a second node process on this machine, joined through
``ray_kwargs.ray_init.address``):

* ``two``: Qwen-Image with CFG 4 (the negative embeddings travel too), 2 replicas + 2 actor ranks
  over the two nodes, 2 steps, log π_old from the rollout, a checkpoint every step;
* ``preempted``: ``two``'s command saving only its last step, SIGTERM sent to its driver once step 2 started
  generating: the driver checkpoints step 1 and exits with ``EXIT_PREEMPTED`` (``trainer/diffusion/preemption.py``);
* ``resumed``: ``preempted``'s directory as a second attempt killed in the middle of step 2's save would leave it
  (step 2's checkpoint a ``global_step_2.partial`` without some of its files, the tracker at 1), resumed with the
  same command on the same cluster: it must reach ``two``'s metrics, and step 2's checkpoint must come out
  complete and bit-identical to ``two``'s. One resume serves both faults: each leaves step 1 as the newest
  complete checkpoint and step 2 to redo.

The output-directory checks that need no trainer (refusals, the fallback when the tracker names
a missing checkpoint) run on copies of ``two``'s directory, so they see what the real checkpoint
code writes. The one-replica run of every other model is ``test_flowgrpo_models_e2e.py``; ``two`` is Qwen-Image's
(its summary's diffusers lines load its LoRA into QwenImagePipeline there too).

Prompts have different token lengths (the rollout right-pads ``prompt_embeds``; the actor must
replay the padded batch exactly).
"""

from __future__ import annotations

import logging
import shutil
import signal
import subprocess

import pytest
import torch
from trainer_helpers import (
    LOGPROB_BOUND,
    by_step,
    check_run,
    check_summary,
    entry_point_command,
    lora_of,
    read_metrics,
    run_entry_point,
    run_trainer,
)

from verl_omni.trainer.diffusion import run_dir
from verl_omni.utils.exit_codes import EXIT_PREEMPTED

# a trainer run starts Ray, replicas and the actor: minutes on a busy 2-core machine
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]


# the last step of every run (and the step a resume redoes)
STEPS = 2


# 2 replicas + 2 ranks over two nodes (1 device each), CFG 4; its resumed copy must use exactly these settings
TWO_RANK_ARGS = (
    f"trainer.total_training_steps={STEPS}",
    f"trainer.test_freq={STEPS}",
    "trainer.save_freq=1",
    "trainer.nnodes=2",
    "trainer.n_gpus_per_node=1",
    "actor_rollout_ref.rollout.nnodes=2",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
    "actor_rollout_ref.rollout.true_cfg_scale=4.0",
    "actor_rollout_ref.actor.use_rollout_log_probs=true",
    # bypass, with the actor's replay checked against the rollout's log-probs at the first step only
    f"actor_rollout_ref.actor.rollout_log_prob_check_freq={STEPS}",
    # half the blocks keep their activations through the FSDP2 backward of both ranks (the engine's path for the key)
    "actor_rollout_ref.model.gradient_checkpointing_fraction=0.5",
)


def cluster_actors(cluster, connect) -> list:
    """The cluster's actors (alive or dead, of every run so far) as Ray's state API lists them."""
    import ray
    from ray.util.state import list_actors

    connect()
    try:
        return list_actors(address=cluster[2], detail=True, limit=1000)
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def two(ray_cluster, ray_connect, tiny_qwen_image_path, prompt_files, tmp_path_factory):
    """The run, its records and the actors it placed (the cluster's actors it added: earlier runs share it)."""
    out = tmp_path_factory.mktemp("two") / "run"
    earlier = {a.actor_id for a in cluster_actors(ray_cluster, ray_connect)}
    records, wall = run_trainer(out, tiny_qwen_image_path, prompt_files, ray_cluster, *TWO_RANK_ARGS)
    print(f"2 replicas + 2 ranks on two nodes, {STEPS} steps: {wall:.0f} s")
    return out, records, [a for a in cluster_actors(ray_cluster, ray_connect) if a.actor_id not in earlier]


def copy_of(run, tmp_path_factory, name: str):
    out = tmp_path_factory.mktemp(name) / "run"
    shutil.copytree(run, out)
    return out


def killed_mid_save(run, saved=None) -> None:
    """Make ``run`` what a kill during step 2's save leaves: a step 2 checkpoint as the save's ``.partial`` directory
    with only some of its files (the last rank's state and ``data.pt`` not written, no completeness marker), the
    tracker at step 1. The checkpoint is ``run``'s own (renamed, the tracker set back) or, for a run that stopped
    at step 1, ``saved``'s step 2 (the same command's). A real kill cannot be aimed at that moment without a fake;
    the directory it leaves is this."""
    partial = run_dir.partial_dir(run, STEPS)
    if saved is None:
        run_dir.step_dir(run, STEPS).rename(partial)
        (run / run_dir.TRACKER_FILE).write_text(str(STEPS - 1))
    else:
        assert run_dir.read_tracker(run) == STEPS - 1
        shutil.copytree(run_dir.step_dir(saved, STEPS), partial)
    last_rank_state = sorted(partial.glob("actor/engine_state_rank*_of*.pt"))[-1]
    for path in (partial / run_dir.COMPLETE_FILE, partial / "data.pt", last_rank_state):
        path.unlink()


def test_two_replicas_two_ranks_train_with_rollout_log_probs(two, tiny_qwen_image_path):
    run, records, _ = two
    check_run(run, records, STEPS, extra_keys=())
    check_summary(run, tiny_qwen_image_path, STEPS)
    # the check's steps (the first, then every STEPS-th after) replay a row of each prompt group (the default
    # actor.rollout_log_prob_check_per_prompt=1) against the rollout's log-probs
    assert by_step(records)[1]["old_log_prob/rollout_diff_max"] <= LOGPROB_BOUND
    assert by_step(records)[1]["old_log_prob/check_rows"] == 2, "the tiny run's two prompts, one row each"
    assert "timing_s/old_log_prob" not in by_step(records)[STEPS], "bypass mode skips the phase between checks"
    assert sorted(p.name for p in run.glob("global_step_*")) == [f"global_step_{s}" for s in range(1, STEPS + 1)]


def test_two_node_run_has_two_ranks_and_places_its_actors_on_both_nodes(two):
    _, _, actors = two
    ranks = [a for a in actors if a.class_name == "DiffusionActorWorker"]
    print("placement:", sorted((a.class_name, a.node_id[:8]) for a in actors))
    assert len(ranks) == 2
    assert len({a.node_id for a in actors}) == 2, "the run's actors were placed on both nodes"


def trainer_config(run, **keys):
    from verl_omni.trainer.config import FlowGRPOTrainerConfig

    return FlowGRPOTrainerConfig(default_local_dir=str(run), nnodes=2, n_gpus_per_node=1, **keys)


def test_auto_resume_with_the_latest_checkpoint_missing_falls_back_to_the_newest_complete_one(
    two, tmp_path_factory, caplog
):
    """verl's ``find_latest_ckpt_path`` returned None here and the run trained from scratch over the old files."""
    run = copy_of(two[0], tmp_path_factory, "missing_latest")
    shutil.rmtree(run / f"global_step_{STEPS}")
    with caplog.at_level(logging.WARNING, logger=run_dir.__name__):
        opened = run_dir.open_run_dir(trainer_config(run))
    opened.lock.release()
    assert opened.resume_from == run / f"global_step_{STEPS - 1}"
    assert f"global_step_{STEPS}, which does not exist" in caplog.text and f"global_step_{STEPS - 1}" in caplog.text


def test_a_run_into_a_finished_run_with_resume_disabled_is_refused_before_ray_and_changes_nothing(
    two, tiny_qwen_image_path, prompt_files
):
    """It used to truncate metrics.jsonl and rewrite the run's checkpoints beside the old last one."""
    run = two[0]

    def run_files():
        # Hydra records each invocation under hydra/<time>/ (hydra.run.dir); that is not the run's output
        return {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file() and "hydra" not in p.parts}

    before = run_files()
    proc = run_entry_point(run, tiny_qwen_image_path, prompt_files, "trainer.resume_mode=disable")
    assert proc.returncode != 0
    message = proc.stdout + proc.stderr
    assert "holds an earlier run" in message and "trainer.overwrite_output_dir=true" in message, message[-3000:]
    assert "trainer.resume_mode=auto" in message and "trainer.default_local_dir" in message
    assert "ray.init" not in message and "Started a local Ray instance" not in message
    assert run_files() == before


# ``two``'s command saving only its last step: a preemption in step 2 finds step 1 not yet checkpointed
PREEMPT_ARGS = (*(a for a in TWO_RANK_ARGS if not a.startswith("trainer.save_freq=")), f"trainer.save_freq={STEPS}")
# the progress line the driver logs when step 2's generation starts (RayFlowGRPOTrainer._phase)
STEP_2_STARTED = f"step {STEPS}/{STEPS}: gen"


@pytest.fixture(scope="module")
def preempted(ray_cluster, tiny_qwen_image_path, prompt_files, tmp_path_factory):
    """The run, SIGTERM sent to its driver when step 2 logged its start; its directory, exit status and output."""
    address, env, _ = ray_cluster
    out = tmp_path_factory.mktemp("preempted") / "run"
    command = entry_point_command(
        out, tiny_qwen_image_path, prompt_files, f"ray_kwargs.ray_init.address={address}", *PREEMPT_ARGS
    )
    proc = subprocess.Popen(
        command, cwd=out.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if STEP_2_STARTED in line:
                proc.send_signal(signal.SIGTERM)
                break
        lines.extend(proc.stdout)
        returncode = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    left = {
        "complete_steps": run_dir.complete_steps(out),
        "tracker": run_dir.read_tracker(out),
        "partial": list(out.glob(f"*{run_dir.PARTIAL_SUFFIX}")),
        "lock": (out / run_dir.LOCK_FILE).exists(),
        "metric_steps": [r["step"] for r in read_metrics(out)],
    }
    return out, returncode, "".join(lines), left


@pytest.fixture(scope="module")
def resumed(preempted, two, ray_cluster, tiny_qwen_image_path, prompt_files):
    """``preempted``'s directory with a step 2 save cut short (``killed_mid_save``), resumed with the same command."""
    out = preempted[0]
    killed_mid_save(out, two[0])
    records, wall = run_trainer(out, tiny_qwen_image_path, prompt_files, ray_cluster, *PREEMPT_ARGS)
    print(f"resume at step {STEPS - 1}, 1 step: {wall:.0f} s")
    return out, records


def test_sigterm_mid_step_checkpoints_the_last_finished_step_and_exits_cleanly(preempted):
    _, returncode, output, left = preempted
    assert STEP_2_STARTED in output, output[-4000:]
    assert returncode == EXIT_PREEMPTED, output[-6000:]
    assert "SIGTERM received" in output and "step 2 dropped before" in output
    # no C++ stack of Ray's handler, no Python traceback
    assert "Traceback" not in output and "*** SIGTERM" not in output, output[-6000:]
    assert left["complete_steps"] == [1] and left["tracker"] == 1
    assert not left["partial"], "no half-written checkpoint"
    assert not left["lock"], "the run-directory lock is released"
    assert left["metric_steps"] == [0, 1]


def test_the_same_command_resumes_to_the_uninterrupted_runs_metrics(two, resumed):
    _, expected_records, _ = two
    _, records = resumed
    assert [r["step"] for r in records] == list(range(STEPS + 1)), "earlier steps kept, the last appended once"
    expected, got = by_step(expected_records), by_step(records)
    for step in range(1, STEPS + 1):
        compared = [k for k in expected[step] if k.startswith(("critic/", "actor/", "val/", "reward/"))]
        assert len(compared) > 5
        assert {k: got[step][k] for k in compared} == {k: expected[step][k] for k in compared}, f"step {step}"


def test_resume_after_a_kill_mid_save_is_bit_identical_to_the_uninterrupted_run(two, resumed):
    source = two[0]
    run, _ = resumed
    # the partial save was ignored and replaced by a complete last step whose LoRA is the uninterrupted one, bit for bit
    assert not run_dir.partial_dir(run, STEPS).exists()
    assert run_dir.complete_steps(run)[-1] == STEPS
    assert run_dir.checkpoint_problem(run_dir.step_dir(run, STEPS), world_size=2) is None
    a, b = lora_of(source, STEPS), lora_of(run, STEPS)
    assert a.keys() == b.keys()
    different = {k: (a[k] - b[k]).abs().max().item() for k in a if not torch.equal(a[k], b[k])}
    assert not different, different

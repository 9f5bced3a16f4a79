"""``python -m verl_omni.trainer.main_flowgrpo`` end to end on the tiny model: real Ray, vLLM-Omni, FSDP2, reward loop.

Three trainer runs (each a subprocess of the real entry point), shared by the tests below:

* ``one``: 1 rollout replica + 1 actor rank on the run's own local Ray, the replica colocated
  with the rank (``trainer.colocate_rollout``, the one-GPU layout), 2 steps, the actor recomputes
  log π_old, a checkpoint every step with ``trainer.max_actor_ckpt_to_keep=1``;
* ``two``: 2 replicas + 2 actor ranks on an existing two-node Ray cluster (a head and a second
  node process on this machine, ``ray_kwargs.ray_init.address``), 3 steps, log π_old from the
  rollout, a checkpoint every step;
* ``resumed``: ``two``'s directory as a kill in the middle of step 3's save leaves it (step 3's
  checkpoint a ``global_step_3.partial`` without some of its files, the tracker at 2), resumed on
  the same cluster: step 3 must come out bit-identical to ``two``'s.

The output-directory checks that need no trainer (refusals, the fallback when the tracker names
a missing checkpoint) run on copies of ``two``'s directory, so they see what the real checkpoint
code writes.

Prompts have different token lengths (the rollout right-pads ``prompt_embeds``; the actor must
replay the padded batch exactly). CFG 4, so the negative embeddings travel too.
"""

from __future__ import annotations

import logging
import shutil

import pytest
import torch
from trainer_helpers import LOGPROB_BOUND, by_step, check_run, lora_of, run_entry_point, run_trainer

from verl_omni.trainer.flowgrpo import run_dir

# a trainer run starts Ray, replicas and the actor: minutes on a busy 2-core machine
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]


@pytest.fixture(scope="module")
def one(tiny_qwen_image_path, prompt_files, tmp_path_factory):
    out = tmp_path_factory.mktemp("one") / "run"
    records, wall = run_trainer(
        out,
        tiny_qwen_image_path,
        prompt_files,
        "trainer.total_training_steps=2",
        "trainer.test_freq=2",
        "trainer.colocate_rollout=true",
        "trainer.save_freq=1",
        "trainer.max_actor_ckpt_to_keep=1",
    )
    print(f"1 replica + 1 rank, 2 steps: {wall:.0f} s")
    return out, records


def two_rank_args(address: str) -> tuple[str, ...]:
    """The 2 replicas + 2 ranks run over two nodes (1 device each); its resumed copy must use exactly these settings."""
    return (
        f"ray_kwargs.ray_init.address={address}",
        "trainer.total_training_steps=3",
        "trainer.test_freq=3",
        "trainer.save_freq=1",
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=1",
        "actor_rollout_ref.rollout.nnodes=2",
        "actor_rollout_ref.rollout.n_gpus_per_node=1",
        "actor_rollout_ref.actor.use_rollout_log_probs=true",
    )


def actors_of_the_run(address: str, dashboard: str) -> list:
    """The cluster's actors (alive or dead) as Ray's state API lists them."""
    import ray
    from ray.util.state import list_actors

    ray.init(address=address)
    try:
        return list_actors(address=dashboard, detail=True, limit=1000)
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def two(two_node_cluster, tiny_qwen_image_path, prompt_files, tmp_path_factory):
    """The run, its records and the actors it placed (listed before ``resumed`` adds its own)."""
    address, env, dashboard = two_node_cluster
    out = tmp_path_factory.mktemp("two") / "run"
    records, wall = run_trainer(out, tiny_qwen_image_path, prompt_files, *two_rank_args(address), env=env)
    print(f"2 replicas + 2 ranks on two nodes, 3 steps: {wall:.0f} s")
    return out, records, actors_of_the_run(address, dashboard)


def copy_of(run, tmp_path_factory, name: str):
    out = tmp_path_factory.mktemp(name) / "run"
    shutil.copytree(run, out)
    return out


def killed_mid_save(run) -> None:
    """Make ``run`` what a kill during step 3's save leaves: the save's ``.partial`` directory with only some
    of its files (rank 1's state and ``data.pt`` not written, no completeness marker), the tracker still at 2.
    A real kill cannot be aimed at that moment without a fake; the directory it leaves is this."""
    partial = run_dir.partial_dir(run, 3)
    run_dir.step_dir(run, 3).rename(partial)
    for name in (run_dir.COMPLETE_FILE, "data.pt", "actor/engine_state_rank1_of2.pt"):
        (partial / name).unlink()
    (run / run_dir.TRACKER_FILE).write_text("2")


@pytest.fixture(scope="module")
def resumed(two, two_node_cluster, tiny_qwen_image_path, prompt_files, tmp_path_factory):
    """``two`` killed while saving step 3 (see ``killed_mid_save``), resumed with the same command."""
    address, env, _ = two_node_cluster
    out = copy_of(two[0], tmp_path_factory, "resumed")
    killed_mid_save(out)
    records, wall = run_trainer(
        out,
        tiny_qwen_image_path,
        prompt_files,
        *two_rank_args(address),
        "trainer.val_before_train=false",
        env=env,
    )
    print(f"resume at step 2, 1 step: {wall:.0f} s")
    return out, records


def check_summary(run, model, steps: int) -> None:
    """The summary's diffusers lines, executed as printed, load the run's final (trained) LoRA; the curve is a PNG."""
    from PIL import Image

    from verl_omni.trainer.flowgrpo.summary import CURVE_FILE, DIFFUSERS_HEADER, SUMMARY_FILE

    lines = (run / SUMMARY_FILE).read_text().splitlines()
    assert lines[0].startswith(f"Flow-GRPO run finished: {steps} of {steps} steps")
    code = "\n".join(line.strip() for line in lines[lines.index(f"  {DIFFUSERS_HEADER}") + 1 :])
    print(code)
    assert f"from_pretrained({str(model)!r})" in code and f"global_step_{steps}" in code
    namespace = {}
    exec(code, namespace)
    pipe = namespace["pipe"]
    assert pipe.get_active_adapters(), "no LoRA adapter loaded"
    lora_b = [p for name, p in pipe.transformer.named_parameters() if "lora_B" in name]
    assert lora_b and sum(float(p.detach().norm()) for p in lora_b) > 0, "the loaded LoRA is not the trained one"
    assert Image.open(run / CURVE_FILE).size == (640, 400)


def test_one_replica_one_rank_trains_logs_and_syncs(one, tiny_qwen_image_path):
    run, records = one
    check_summary(run, tiny_qwen_image_path, 2)
    check_run(
        run,
        records,
        2,
        extra_keys=("timing_s/old_log_prob", "old_log_prob/rollout_diff_max", "rollout/requests_per_engine_batch"),
    )
    for record in records[1:]:
        assert record["data"]["old_log_prob/rollout_diff_max"] <= LOGPROB_BOUND
        # the step's two group requests (validation's are not counted), in one batch or two (arrival timing)
        batches, per_batch = (
            record["data"]["rollout/engine_batches"],
            record["data"]["rollout/requests_per_engine_batch"],
        )
        # on CPU one request per transformer batch (reproducible numerics, CPU_MAX_BATCH_REQUESTS)
        assert (batches, per_batch) == (2, 1), (batches, per_batch)


def test_max_actor_ckpt_to_keep_keeps_only_the_newest_complete_checkpoint(one):
    run, _ = one
    assert sorted(p.name for p in run.glob("global_step_*")) == ["global_step_2"]
    assert run_dir.checkpoint_problem(run / "global_step_2", world_size=1) is None
    assert (run / run_dir.TRACKER_FILE).read_text() == "2"
    assert not (run / run_dir.LOCK_FILE).exists(), "the run releases its lock when it ends"


def test_two_replicas_two_ranks_train_with_rollout_log_probs(two):
    run, records, _ = two
    check_run(run, records, 3, extra_keys=())
    assert "timing_s/old_log_prob" not in by_step(records)[1], "bypass mode skips the phase"
    assert sorted(p.name for p in run.glob("global_step_*")) == ["global_step_1", "global_step_2", "global_step_3"]


def test_two_node_run_has_two_ranks_and_places_its_actors_on_both_nodes(two):
    _, _, actors = two
    ranks = [a for a in actors if a.class_name == "DiffusionActorWorker"]
    print("placement:", sorted((a.class_name, a.node_id[:8]) for a in actors))
    assert len(ranks) == 2
    assert len({a.node_id for a in actors}) == 2, "the run's actors were placed on both nodes"


def test_resume_after_a_kill_mid_save_is_bit_identical_to_the_uninterrupted_run(two, resumed):
    source, uninterrupted, _ = two
    run, records = resumed
    assert [r["step"] for r in records] == [0, 1, 2, 3], "earlier steps kept, step 3 appended once"
    assert by_step(records)[2] == by_step(uninterrupted)[2]
    expected, got = by_step(uninterrupted)[3], by_step(records)[3]
    compared = [k for k in expected if k.startswith(("critic/", "actor/", "val/", "reward/"))]
    assert len(compared) > 10
    assert {k: got[k] for k in compared} == {k: expected[k] for k in compared}
    # the partial save was ignored and replaced by a complete step 3 whose LoRA is the uninterrupted one, bit for bit
    assert not run_dir.partial_dir(run, 3).exists()
    assert run_dir.checkpoint_problem(run_dir.step_dir(run, 3), world_size=2) is None
    a, b = lora_of(source, 3), lora_of(run, 3)
    assert a.keys() == b.keys()
    different = {k: (a[k] - b[k]).abs().max().item() for k in a if not torch.equal(a[k], b[k])}
    assert not different, different


def trainer_config(run, **keys):
    from verl_omni.trainer.config import FlowGRPOTrainerConfig

    return FlowGRPOTrainerConfig(default_local_dir=str(run), nnodes=2, n_gpus_per_node=1, **keys)


def test_auto_resume_with_the_latest_checkpoint_missing_falls_back_to_the_newest_complete_one(
    two, tmp_path_factory, caplog
):
    """verl's ``find_latest_ckpt_path`` returned None here and the run trained from scratch over the old files."""
    run = copy_of(two[0], tmp_path_factory, "missing_latest")
    shutil.rmtree(run / "global_step_3")
    with caplog.at_level(logging.WARNING, logger=run_dir.__name__):
        opened = run_dir.open_run_dir(trainer_config(run))
    opened.lock.release()
    assert opened.resume_from == run / "global_step_2"
    assert "global_step_3, which does not exist" in caplog.text and "global_step_2" in caplog.text


def test_a_run_into_a_finished_run_with_resume_disabled_is_refused_before_ray_and_changes_nothing(
    two, tiny_qwen_image_path, prompt_files
):
    """It used to truncate metrics.jsonl and rewrite global_step_1..2 beside the old global_step_3."""
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

"""``python -m verl_omni.trainer.main_flowgrpo`` end to end on the tiny model: real Ray, vLLM-Omni, FSDP2, reward loop.

Three trainer runs (each a subprocess of the real entry point), shared by the tests below:

* ``one``: 1 rollout replica + 1 actor rank on the run's own local Ray, the replica colocated
  with the rank (``trainer.colocate_rollout``, the one-GPU layout), 2 steps, the actor recomputes
  log π_old;
* ``two``: 2 replicas + 2 actor ranks on an existing two-node Ray cluster (a head and a second
  node process on this machine, ``ray_kwargs.ray_init.address``), 3 steps, log π_old from the
  rollout, a checkpoint every step;
* ``resumed``: ``two``'s directory as it was after step 2 (step 3's checkpoint removed), resumed
  on the same cluster.

Prompts have different token lengths (the rollout right-pads ``prompt_embeds``; the actor must
replay the padded batch exactly). CFG 4, so the negative embeddings travel too.
"""

from __future__ import annotations

import shutil

import pytest
from trainer_helpers import LOGPROB_BOUND, by_step, check_run, run_trainer

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


@pytest.fixture(scope="module")
def resumed(two, two_node_cluster, tiny_qwen_image_path, prompt_files, tmp_path_factory):
    """``two`` stopped after step 2: its directory without step 3's checkpoint, resumed to step 3."""
    address, env, _ = two_node_cluster
    source = two[0]
    out = tmp_path_factory.mktemp("resumed") / "run"
    shutil.copytree(source, out, ignore=shutil.ignore_patterns("global_step_3"))
    (out / "latest_checkpointed_iteration.txt").write_text("2")
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
        assert batches * per_batch == 2, (batches, per_batch)
        print(f"step {record['step']}: {batches:.0f} engine batches, {per_batch:.1f} requests each")


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


def test_resume_after_step_2_reproduces_step_3_and_keeps_the_metrics_file(two, resumed):
    _, uninterrupted, _ = two
    _, records = resumed
    assert [r["step"] for r in records] == [0, 1, 2, 3], "earlier steps kept, step 3 appended once"
    assert by_step(records)[2] == by_step(uninterrupted)[2]
    expected, got = by_step(uninterrupted)[3], by_step(records)[3]
    compared = [k for k in expected if k.startswith(("critic/", "actor/", "val/", "reward/"))]
    assert len(compared) > 10
    for key in compared:
        assert got[key] == pytest.approx(expected[key], rel=1e-6, abs=1e-9), key

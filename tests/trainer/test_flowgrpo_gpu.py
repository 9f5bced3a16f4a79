"""The trainer on one GPU: actor and rollout colocated, the rollout asleep during the actor phases; and on two GPUs,
actor and rollout in separate pools, the weights broadcast over NCCL.

One run of the real entry point (tiny Qwen-Image in bf16, 2 steps): the replica is placed on the
actor's GPU (``trainer.colocate_rollout=true``), its engine offloads its weights after each
generation (``sleep(level=1)``) and gets them back before the LoRA push. Step 2 samples after a
sleep/wake cycle: had the weights come back wrong, the actor's replay of step 2's samples would
disagree with the rollout's log-probs far beyond step 1's bf16 difference.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch
from figures import figure
from trainer_helpers import REPO, by_step, read_metrics, run_entry_point

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(1200)]

ONE_GPU = ("trainer.device=cuda", "trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.n_gpus_per_node=1")


# colocated on the one GPU, the rollout asleep during the actor phases, 2 steps, validation at 0 and 2
COLOCATED = (
    *ONE_GPU,
    "trainer.colocate_rollout=true",
    "actor_rollout_ref.rollout.free_cache_engine=true",
    "actor_rollout_ref.rollout.dtype=bfloat16",
    "trainer.total_training_steps=2",
    "trainer.test_freq=2",
)


def _colocated_run(out, tiny_path, prompt_files, *extra) -> list[dict]:
    """One colocated run of the entry point; its own Ray (the trainer starts it), not the session's CPU cluster:
    one node that owns the one GPU. Returns the metrics records."""
    start = time.perf_counter()
    proc = run_entry_point(out, tiny_path, prompt_files, *COLOCATED, *extra)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    print(f"colocated on one GPU, 2 steps {extra}")
    figure("run_s", time.perf_counter() - start)
    return read_metrics(out)


@pytest.fixture(scope="module")
def colocated(tiny_qwen_image_bf16_path, prompt_files, tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu") / "run"
    return out, _colocated_run(out, tiny_qwen_image_bf16_path, prompt_files)


def test_colocated_run_trains_and_the_woken_rollout_matches_the_actor(colocated):
    run, records = colocated
    metrics = by_step(records)
    assert sorted(metrics) == [0, 1, 2]
    diffs = [metrics[s]["old_log_prob/rollout_diff_max"] for s in (1, 2)]
    # actor vs rollout log-prob, bf16 on CUDA; step 2 samples after a sleep/wake cycle
    figure("logprob_diff_step1", diffs[0])
    figure("logprob_diff_step2", diffs[1])
    for key, value in metrics[2].items():
        if key.startswith("timing_s/"):
            figure(key, value)
    assert diffs[1] <= 10 * max(diffs[0], 1e-3)
    assert metrics[2]["sync/lora_modules_bound_min"] > 0
    # the update's activations, freed but reserved by the actor process, went back before the rollout woke
    figure("actor_cache_released_gib", metrics[2]["sync/actor_cache_released_gib"])
    assert metrics[2]["sync/actor_cache_released_gib"] > 0
    assert metrics[2]["val/score/mean"] != metrics[0]["val/score/mean"], "the trained LoRA reached the rollout"


@pytest.fixture(scope="module")
def colocated_full(tiny_qwen_image_bf16_path, prompt_files, tmp_path_factory):
    """Full fine-tuning colocated: the transformer goes to the rollout in buckets by CUDA IPC (``device_share``)."""
    out = tmp_path_factory.mktemp("gpu_full") / "run"
    return out, _colocated_run(
        out,
        tiny_qwen_image_bf16_path,
        prompt_files,
        "actor_rollout_ref.model.lora.rank=0",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=1",
    )


def _synced_steps(records, what: str) -> dict:
    """What every colocated sync must show: steps 0-2 logged, step 2 (sampled with step 1's synced weights) within 10x
    of step 1's bf16 actor-vs-rollout difference (a lost or stale sync separates them far more), validation moved by
    the training; returns step 2's ``sync/*`` metrics."""
    metrics = by_step(records)
    assert sorted(metrics) == [0, 1, 2]
    diffs = [metrics[s]["old_log_prob/rollout_diff_max"] for s in (1, 2)]
    sync = {k: v for k, v in metrics[2].items() if k.startswith("sync/")}
    print(f"{what}: actor vs rollout log-prob (bf16 on CUDA) and step 2's sync")
    figure("logprob_diff_step1", diffs[0])
    figure("logprob_diff_step2", diffs[1])
    for key, value in sync.items():
        figure(key, value)
    assert diffs[1] <= 10 * max(diffs[0], 1e-3)
    assert metrics[2]["val/score/mean"] != metrics[0]["val/score/mean"], "the trained weights reached the rollout"
    return sync


def test_colocated_full_fine_tuning_syncs_every_bucket_by_cuda_ipc(colocated_full):
    sync = _synced_steps(colocated_full[1], "full fine-tuning")
    assert sync["sync/full_weight_buckets"] > 1 and sync["sync/full_weight_params_written_min"] > 0


@pytest.fixture(scope="module")
def colocated_merged(tiny_qwen_image_bf16_path, prompt_files, tmp_path_factory):
    """A LoRA served merged (``model.lora.merge``): the adapted linears' merged weights by CUDA IPC (the tiny model's
    16 adapted linears are 0.25 MB: one bucket)."""
    out = tmp_path_factory.mktemp("gpu_merged") / "run"
    return out, _colocated_run(out, tiny_qwen_image_bf16_path, prompt_files, "actor_rollout_ref.model.lora.merge=true")


def test_colocated_merged_lora_syncs_the_merged_linears_by_cuda_ipc(colocated_merged):
    sync = _synced_steps(colocated_merged[1], "merged LoRA")
    assert sync["sync/merged_lora_buckets"] == 1 and sync["sync/merged_lora_params_written_min"] > 0
    assert "sync/lora_modules_bound_min" not in sync, "the rollout served no adapter"


def test_standalone_rollout_beside_the_actor_on_one_gpu_is_refused(tiny_qwen_image_bf16_path, prompt_files, tmp_path):
    """One GPU cannot hold a standalone replica's GPU bundle and the actor's: a clear error, not a wait.

    The run sees one GPU whatever the host has (on a host of two, the replica would take the second and train)."""
    train, val = prompt_files
    one_visible_gpu = {**os.environ, "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "verl_omni.trainer.main_flowgrpo",
            f"actor_rollout_ref.model.path={tiny_qwen_image_bf16_path}",
            f"data.train_files={train}",
            f"data.val_files={val}",
            f"trainer.default_local_dir={tmp_path / 'run'}",
            *ONE_GPU,
            "trainer.colocate_rollout=false",
        ],
        cwd=REPO,
        env=one_visible_gpu,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode != 0
    assert "trainer.colocate_rollout=true" in proc.stderr


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="separate pools need 2 GPUs: one actor rank, one replica")
def test_separate_pools_full_fine_tuning_broadcasts_every_bucket_over_nccl(
    tiny_qwen_image_bf16_path, prompt_files, tmp_path
):
    """Full fine-tuning with the actor on GPU 0 and the replica on GPU 1 (``colocate_rollout=false``): ``auto`` picks
    the collective transport, actor rank 0 broadcasts each bucket to the replica's worker over NCCL."""
    start = time.perf_counter()
    proc = run_entry_point(
        tmp_path / "run",
        tiny_qwen_image_bf16_path,
        prompt_files,
        *ONE_GPU,
        "trainer.colocate_rollout=false",
        "actor_rollout_ref.rollout.dtype=bfloat16",
        "trainer.total_training_steps=2",
        "trainer.test_freq=2",
        "actor_rollout_ref.model.lora.rank=0",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=1",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    metrics = by_step(read_metrics(tmp_path / "run"))
    assert sorted(metrics) == [0, 1, 2]
    diffs = [metrics[s]["old_log_prob/rollout_diff_max"] for s in (1, 2)]
    sync = {k: v for k, v in metrics[2].items() if k.startswith("sync/")}
    # separate pools on 2 GPUs, 2 steps, full fine-tuning: actor vs rollout log-prob (bf16) and step 2's sync
    figure("run_s", time.perf_counter() - start)
    figure("logprob_diff_step1", diffs[0])
    figure("logprob_diff_step2", diffs[1])
    for key, value in sync.items():
        figure(key, value)
    assert sync["sync/weight_group_members"] == 2, "actor rank 0 and the replica's worker"
    assert sync["sync/full_weight_buckets"] > 1 and sync["sync/full_weight_params_written_min"] > 0
    # step 2 samples with the broadcast transformer: a lost or stale bucket would make the replay disagree
    assert diffs[1] <= 10 * max(diffs[0], 1e-3)
    assert metrics[2]["val/score/mean"] != metrics[0]["val/score/mean"], "the trained transformer reached the rollout"

"""Offline Diffusion-DPO end to end: the entry point trains the tiny model's LoRA on a preference parquet made by
the converter (``examples/data_process/preference_pairs.py``), starting the actor and no rollout engine."""

from __future__ import annotations

import subprocess
import sys

import pytest
from trainer_helpers import REPO, entry_point_env, lora_b_norm, read_metrics, run_entry_point

# a trainer run starts Ray workers and the actor: a minute or more on a busy 2-core machine
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

STEPS = 2


@pytest.fixture(scope="module")
def preference_parquet(tmp_path_factory):
    """train.parquet of four pairs (chosen bright, rejected dark) written by the converter from a pair folder."""
    from PIL import Image

    root = tmp_path_factory.mktemp("offline_dpo")
    for i, prompt in enumerate(("a red cat", "a blue boat near a river", "a green tree", "a white castle", "a sun")):
        pair = root / "pairs" / f"{i:04d}"
        pair.mkdir(parents=True)
        (pair / "prompt.txt").write_text(prompt)
        Image.new("RGB", (24, 40), (220, 210 - 10 * i, 200)).save(pair / "chosen.png")
        Image.new("RGB", (24, 40), (30, 20 + 10 * i, 40)).save(pair / "rejected.jpg")
    script = REPO / "examples" / "data_process" / "preference_pairs.py"
    command = [sys.executable, str(script), "--pairs", str(root / "pairs"), "--out", str(root / "prefs"), "--val", "1"]
    subprocess.run(command, check=True, cwd=REPO, env=entry_point_env(), capture_output=True)
    return root / "prefs" / "train.parquet"


def test_offline_dpo_trains_the_lora_on_the_pairs_without_a_rollout_engine(
    tiny_qwen_image_path, prompt_files, preference_parquet, ray_cluster, tmp_path
):
    address, env, _ = ray_cluster
    out = tmp_path / "run"
    proc = run_entry_point(
        out,
        tiny_qwen_image_path,
        prompt_files,
        f"ray_kwargs.ray_init.address={address}",
        "algorithm=diffusion_dpo",
        f"data.preference_files={preference_parquet}",
        "actor_rollout_ref.rollout.sde_window_size=null",
        "trainer.val_before_train=false",
        "trainer.test_freq=0",
        f"trainer.total_training_steps={STEPS}",
        f"trainer.save_freq={STEPS}",
        env=env,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-8000:]
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    for record in metrics:
        data = record["data"]
        # each step's two pairs are trained with the DPO loss; the first step's policy is the reference (loss log 2)
        assert data["dpo/pairs"] == 2.0 and data["dpo/pairs_dropped"] == 0.0
        assert {"actor/dpo_loss", "actor/dpo_accuracy", "actor/dpo_margin"} <= data.keys()
        # no rollout, reward or weight-sync phase ran
        assert not {"timing_s/gen", "timing_s/reward", "timing_s/sync"} & data.keys()
    assert abs(metrics[0]["data"]["actor/dpo_loss"] - 0.6931) < 1e-3
    assert metrics[-1]["data"]["actor/dpo_loss"] < metrics[0]["data"]["actor/dpo_loss"]
    # the LoRA moved from its zero-initialised B
    assert lora_b_norm(out, STEPS) > 0
    # the run's Ray workers are the actor's ranks: no vLLMOmniHttpServer replica, reward or agent-loop worker
    placement = [line for line in log.splitlines() if "placement: " in line]
    assert len(placement) == 1 and "actor rank 0" in placement[0], log[-4000:]
    assert "replica" not in placement[0] and "reward worker" not in placement[0]
    assert "vLLMOmniHttpServer" not in log

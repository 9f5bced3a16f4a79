"""Full fine-tuning (``actor_rollout_ref.model.lora.rank=0``) end to end through the real entry point, and its resume.

``full``: the tiny Qwen-Image, 1 actor rank + 1 rollout replica colocated with it (the one-GPU layout) on the
session's Ray cluster, the KL term on (the frozen reference copy), 1 MB buckets (the 1.3 MB transformer in 2),
2 steps, the actor recomputing log π_old, a checkpoint and a validation every step, an EMA of the weights
(``actor.ema_decay``) that validation samples. The trainer's sync path runs for real: the actor
rank builds each checksummed bucket, its Ray object reference goes to the replica's server, the rollout workers
check and load it. After step 1's sync, step 2's rollout must sample with the trained weights: its log-probs equal
the actor's recompute (``old_log_prob/rollout_diff_max``), which the base weights would miss by far more than the
bound (checked on a recorded batch); step 1's validation sampled the EMA, so step 2's rollout matching the actor also
shows the live weights went back after it. ``checkpoint_actor``: step 1's checkpoint loaded into a one-rank actor in this
process by the engine's resume path; the checkpoint's ``transformer/`` loaded by diffusers predicts its velocity,
its ``transformer_ema/`` is the EMA of the base and the two steps' weights.
``resumed``: ``full`` killed while saving step 2 (``test_flowgrpo_e2e.killed_mid_save``), resumed (the resumed
actor's weights synced to the rollout before step 2): step 2 bit-identical, its EMA-sampled validation and EMA
export included. A dropped or corrupted bucket is caused
on the real engine in ``tests/workers/test_full_weight_sync.py``.
"""

from __future__ import annotations

import pytest
import torch
from test_flowgrpo_e2e import STEPS, copy_of, killed_mid_save
from trainer_helpers import LOGPROB_BOUND, by_step, image_of, run_trainer

from verl_omni.trainer.diffusion import run_dir

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

# lr 1e-3: one AdamW step of the whole transformer moves its log-probs well past the probe's bound
EMA_DECAY = 0.5
FULL_FT_ARGS = (
    "actor_rollout_ref.model.lora.rank=0",
    "actor_rollout_ref.actor.optim.lr=1e-3",
    "actor_rollout_ref.actor.kl_beta=0.04",
    f"actor_rollout_ref.actor.ema_decay={EMA_DECAY}",
    "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=1",
    f"trainer.total_training_steps={STEPS}",
    "trainer.test_freq=1",
    "trainer.save_freq=1",
    "trainer.colocate_rollout=true",
)
SYNC_KEYS = (
    "sync/full_weight_buckets",
    "sync/full_weight_megabytes",
    "sync/full_weight_params_written_min",
    "sync/full_weight_seconds",
    "timing_s/sync",
    "timing_s/ref",
    "old_log_prob/rollout_diff_max",
)


@pytest.fixture(scope="module")
def full(ray_cluster, tiny_qwen_image_path, prompt_files, tmp_path_factory):
    out = tmp_path_factory.mktemp("full_ft") / "run"
    records, wall = run_trainer(out, tiny_qwen_image_path, prompt_files, ray_cluster, *FULL_FT_ARGS)
    print(f"full fine-tuning, 1 rank + 1 colocated replica, {STEPS} steps: {wall:.0f} s")
    return out, records


@pytest.fixture(scope="module")
def resumed(full, ray_cluster, tiny_qwen_image_path, prompt_files, tmp_path_factory):
    out = copy_of(full[0], tmp_path_factory, "full_ft_resumed")
    killed_mid_save(out)
    records, wall = run_trainer(
        out, tiny_qwen_image_path, prompt_files, ray_cluster, *FULL_FT_ARGS, "trainer.val_before_train=false"
    )
    print(f"full fine-tuning resumed at step {STEPS - 1}, 1 step: {wall:.0f} s")
    return out, records


@pytest.fixture(scope="module")
def checkpoint_actor(full, tiny_qwen_image_path):
    """A one-rank full fine-tuning actor (gloo, in this process) into which the engine's resume path loaded step
    ``STEPS - 1``'s checkpoint: the weights the rollout sampled step ``STEPS`` with."""
    import torch.distributed as dist
    from workers.actor.actor_helpers import build_actor

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # one rank: no port to race for
    try:
        actor = build_actor(tiny_qwen_image_path, lora_rank=0, lr=1e-3, ppo_mini_batch_size=4)
        actor.engine.load_checkpoint(str(run_dir.step_dir(full[0], STEPS - 1) / "actor"))
        yield actor
    finally:
        dist.destroy_process_group()


def transformer_of(run, step: int, name: str = "transformer"):
    from diffusers import QwenImageTransformer2DModel

    return QwenImageTransformer2DModel.from_pretrained(run / f"global_step_{step}" / "actor" / name).eval()


def test_full_fine_tuning_trains_syncs_in_checked_buckets_and_the_rollout_samples_with_it(full):
    run, records = full
    metrics = by_step(records)
    assert sorted(metrics) == list(range(STEPS + 1))
    for step in range(1, STEPS + 1):
        missing = [k for k in SYNC_KEYS if k not in metrics[step]]
        assert not missing, f"step {step} lacks {missing}"
        assert "sync/lora_modules_bound_min" not in metrics[step]
        # 1 MB buckets of the 1.3 MB transformer; every rollout parameter written from checksummed buckets
        assert metrics[step]["sync/full_weight_buckets"] == 2
        assert 1 < metrics[step]["sync/full_weight_megabytes"] < 2
        assert metrics[step]["sync/full_weight_params_written_min"] > 0
        assert metrics[step]["actor/logprob_diff_max"] <= LOGPROB_BOUND
        # the rollout's log-probs of what it sampled equal the actor's: at step 2 those are step 1's synced weights
        assert metrics[step]["old_log_prob/rollout_diff_max"] <= LOGPROB_BOUND
    # step 1's validation sampled the EMA (pushed to the rollout, then the live weights back): the step-2 probe above
    assert "val/score/mean" in metrics[1]
    # validation draws the same noise every time (ODE): other images after training = the rollout has new weights
    before, after = image_of(run / "images" / "val_step_0.png"), image_of(run / "images" / f"val_step_{STEPS}.png")
    assert before.shape == after.shape and (before != after).any()


def test_checkpoint_is_a_diffusers_transformer_with_the_actors_velocity(
    full, checkpoint_actor, recorded_qwen_image_batch, tiny_qwen_image_path
):
    from diffusers import QwenImageTransformer2DModel
    from workers.actor.actor_helpers import batch_of

    from verl_omni.pipelines.qwen_image.training_adapter import QwenImageTrainingAdapter
    from verl_omni.pipelines.sampling import SamplingSpec

    run, _ = full
    step_dir = run_dir.step_dir(run, STEPS - 1)
    assert not (step_dir / "actor" / "lora").exists()
    saved = transformer_of(run, STEPS - 1)
    base = QwenImageTransformer2DModel.from_pretrained(tiny_qwen_image_path / "transformer").eval()
    moved = [name for name, t in base.state_dict().items() if not torch.equal(saved.state_dict()[name], t)]
    assert len(moved) > len(base.state_dict()) // 2, f"only {len(moved)} of {len(base.state_dict())} tensors trained"

    rec = recorded_qwen_image_batch[1]
    spec = SamplingSpec(**rec["spec"])
    batch = batch_of(rec, torch.zeros(rec["all_latents"].shape[0]))
    engine = checkpoint_actor.engine
    with torch.no_grad(), engine.eval_mode():
        expected = QwenImageTrainingAdapter.step_velocity(engine.module, batch, 0, spec, engine.vae_scale_factor)
    with torch.no_grad():
        loaded = QwenImageTrainingAdapter.step_velocity(saved, batch, 0, spec, engine.vae_scale_factor)
        untrained = QwenImageTrainingAdapter.step_velocity(base, batch, 0, spec, engine.vae_scale_factor)
    gap, moved_by = (loaded - expected).abs().max().item(), (untrained - expected).abs().max().item()
    print(f"max |v_diffusers − v_actor|: {gap:.2e}; the base model's velocity is {moved_by:.2e} away")
    assert gap <= 1e-6 < moved_by
    # the step-2 probe separates synced from stale rollout weights: the base model's log-probs miss its bound
    stale = (checkpoint_actor.compute_log_prob(batch, spec) - rec["sanity_log_probs"]).abs().max().item()
    print(f"max |log π_step1 − log π_base| on a recorded batch: {stale:.2e} (probe bound {LOGPROB_BOUND:g})")
    assert stale > LOGPROB_BOUND


def test_the_ema_transformer_loads_in_diffusers_and_is_the_ema_of_the_base_and_each_steps_weights(
    full, tiny_qwen_image_path
):
    from diffusers import QwenImageTransformer2DModel

    run, _ = full
    base = QwenImageTransformer2DModel.from_pretrained(tiny_qwen_image_path / "transformer").state_dict()
    live = [transformer_of(run, step).state_dict() for step in range(1, STEPS + 1)]
    ema = transformer_of(run, STEPS, "transformer_ema").state_dict()
    assert ema.keys() == base.keys()
    for other in (base, live[-1]):
        moved = [name for name, t in other.items() if not torch.equal(ema[name], t)]
        assert len(moved) > len(base) // 2, f"only {len(moved)} of {len(base)} EMA tensors differ"
    # ema_0 = base, ema_k = d·ema_(k-1) + (1 − d)·θ_k after each of the run's optimizer steps (one per step here)
    expected = dict(base)
    for weights in live:
        expected = {name: EMA_DECAY * t + (1 - EMA_DECAY) * weights[name] for name, t in expected.items()}
    gap = max((ema[name] - t).abs().max().item() for name, t in expected.items())
    print(f"max |EMA export − EMA of the checkpoints' weights|: {gap:.2e}")
    assert gap <= 1e-6


def test_the_summary_lines_load_the_trained_transformer_into_the_models_pipeline(full):
    from verl_omni.trainer.diffusion.summary import SUMMARY_FILE, TRANSFORMER_HEADER

    run, _ = full
    lines = (run / SUMMARY_FILE).read_text().splitlines()
    ema = run_dir.step_dir(run, STEPS) / "actor" / "transformer_ema"
    assert any(line.startswith("  final EMA transformer") and line.endswith(str(ema)) for line in lines)
    code = "\n".join(line.strip() for line in lines[lines.index(f"  {TRANSFORMER_HEADER}") + 1 :])
    print(code)
    scope: dict = {}
    exec(code, scope)
    final = transformer_of(run, STEPS).state_dict()
    loaded = scope["pipe"].transformer.state_dict()
    assert loaded.keys() == final.keys() and all(torch.equal(t, final[name]) for name, t in loaded.items())


def test_full_fine_tuning_resume_after_a_kill_mid_save_is_bit_identical(full, resumed):
    source, uninterrupted = full
    run, records = resumed
    assert [r["step"] for r in records] == list(range(STEPS + 1))
    expected, got = by_step(uninterrupted)[STEPS], by_step(records)[STEPS]
    compared = [k for k in expected if k.startswith(("critic/", "actor/", "val/", "old_log_prob/"))]
    assert len(compared) > 10
    assert {k: got[k] for k in compared} == {k: expected[k] for k in compared}
    assert run_dir.checkpoint_problem(run_dir.step_dir(run, STEPS), world_size=1) is None
    for name in ("transformer", "transformer_ema"):
        a, b = transformer_of(source, STEPS, name).state_dict(), transformer_of(run, STEPS, name).state_dict()
        different = [k for k in a if not torch.equal(a[k], b[k])]
        assert not different, (name, different[:4])

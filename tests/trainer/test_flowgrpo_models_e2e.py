"""``python -m verl_omni.trainer.main_flowgrpo`` end to end, once per tiny model: real Ray, vLLM-Omni, FSDP2, reward loop.

``one[<model>]`` (SD3.5, FLUX.1, FLUX.2-dev, FLUX.2-klein (base and step-distilled), Z-Image, Wan2.2 text-to-video
(TI2V-5B and the two-expert A14B), Wan2.2 I2V-A14B, LTX-2 (video with sound), HunyuanVideo-1.5 text-to-video,
Qwen-Image-Edit, FLUX.1-Kontext): the same command with only
``actor_rollout_ref.model.path`` changed (every other default works for every model; the video models also sample 5
frames, the editing models and the image-to-video one read an editing set, Qwen-Image-Edit conditioning its source
images at 32², the base FLUX.2-klein sampling with CFG 4, ``MODEL_ARGS``; FLUX.1-Kontext conditions the set's 32²
images at their own size), a subprocess of
the real entry point on the session's Ray cluster (``ray_cluster``): 1 rollout replica + 1 actor rank,
the replica colocated with the rank (``trainer.colocate_rollout``, the one-GPU layout; the A14B's replica is
split over 2 workers of its own pool instead, ``MODEL_ARGS``), 2 steps, the
actor recomputes log π_old, a checkpoint every step with ``trainer.max_actor_ckpt_to_keep=1``; the
saved LoRA loads in the model's diffusers pipeline and changes its image (a video model's: its video, and its
validation writes mp4s a player decodes, LTX-2's with their sound). The A14B's window (every step, the default) has steps of both experts,
so its log π_old bound holds on both sides of the boundary, and its two LoRA files load into both experts.

The multi-replica run, its resume and the output-directory checks are ``test_flowgrpo_e2e.py``: a file
of its own so that the suite's parallel workers (``pytest -n``, one file per worker) run the two
files side by side.
"""

from __future__ import annotations

import math

import pytest
from trainer_helpers import LOGPROB_BOUND, PIPELINE_ARGS, check_run, check_summary, run_trainer

from verl_omni.trainer.diffusion import run_dir

# a trainer run starts Ray, replicas and the actor: minutes on a busy 2-core machine
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

# the tiny builders (python -m verl_omni.utils.tiny_models NAME): one run per model, the same command otherwise;
# Qwen-Image's run is test_flowgrpo_e2e.py's two-replica one (the same checks, its summary's included)
MODELS = (
    "sd3",
    "flux",
    "flux2",
    "flux2_klein",
    "flux2_klein_distilled",
    "z_image",
    "wan2_2",
    "wan2_2_a14b",
    "wan2_2_i2v_a14b",
    "ltx2",
    "hunyuan_video_1_5",
    "qwen_image_edit",
    "flux_kontext",
)
# what a model adds to the shared command: the video model samples 5 frames (4k + 1; 1 would be a one-frame video);
# the editing model conditions at 32² (the stock 1024² is 16k latent tokens of the tiny VAE)
MODEL_ARGS = {
    # SD3.5's run also serves its LoRA merged (model.lora.merge): the rollout runs plain linears, its log-probs still
    # within the bound of the actor's, its validation images moved by the training
    "sd3": ("actor_rollout_ref.model.lora.merge=true",),
    # the base FLUX.2-klein samples with its CFG (the default config has none): the run records the empty prompt's
    # embeddings and replays both passes; the step-distilled klein's run is the shared command alone
    "flux2_klein": ("actor_rollout_ref.rollout.true_cfg_scale=4",),
    "wan2_2": ("actor_rollout_ref.rollout.num_frames=5",),
    # the A14B's rollout is one replica split over 2 engine workers (rollout sequence parallelism), in a pool of its
    # own (a colocated split needs as many actor ranks): its samples still replay within the bound on the actor
    "wan2_2_a14b": (
        "actor_rollout_ref.rollout.num_frames=5",
        "trainer.colocate_rollout=false",
        "actor_rollout_ref.rollout.n_gpus_per_node=2",
        "actor_rollout_ref.rollout.ulysses_sequence_parallel_size=2",
    ),
    # the image-to-video A14B: the editing set's 32² images are the first frames
    "wan2_2_i2v_a14b": ("actor_rollout_ref.rollout.num_frames=5",),
    # LTX-2: 9 frames (8k + 1: two latent frames) and their sound, denoised as one latent; the release's CFG (video 3,
    # audio 7) with the empty negative prompt
    "ltx2": ("actor_rollout_ref.rollout.num_frames=9",),
    # HunyuanVideo-1.5 text to video (its image-to-video variant's rollout and replay are the engine test's): its
    # LoRA is loaded by the transformer's load_lora_adapter (diffusers' pipeline has no LoRA loader)
    "hunyuan_video_1_5": ("actor_rollout_ref.rollout.num_frames=5",),
    "qwen_image_edit": ("+actor_rollout_ref.rollout.model_kwargs.condition_area=1024",),
}
# the models whose prompts carry source images (an editing set; the image-to-video model's first frames)
EDITING = ("qwen_image_edit", "flux_kontext", "wan2_2_i2v_a14b")
# the last step of every run
STEPS = 2


@pytest.fixture(scope="module", params=MODELS)
def one(request, tiny_model, ray_cluster, prompt_files, edit_prompt_files, tmp_path_factory):
    """``(run, records, model_path, model)`` of the 1 replica + 1 rank run of one model."""
    model = tiny_model(request.param)
    out = tmp_path_factory.mktemp(f"one_{request.param}") / "run"
    records, wall = run_trainer(
        out,
        model,
        edit_prompt_files if request.param in EDITING else prompt_files,
        ray_cluster,
        f"trainer.total_training_steps={STEPS}",
        f"trainer.test_freq={STEPS}",
        "trainer.colocate_rollout=true",
        "trainer.save_freq=1",
        "trainer.max_actor_ckpt_to_keep=1",
        *MODEL_ARGS.get(request.param, ()),
    )
    print(f"{request.param}: 1 replica + 1 rank, {STEPS} steps: {wall:.0f} s")
    return out, records, model, request.param


# the models with sound: their validation mp4s carry it (channels, rate)
SOUND = {"ltx2": (2, 24_000)}


def check_videos(run, model, name) -> None:
    """A video model's validation writes an mp4 per sample that a player decodes to its frames (and, for a model with
    sound, to its audio track); an image model none."""
    import json

    from verl_omni.utils.video import read_audio, read_frames

    videos = sorted(run.glob(f"images/val_step_{STEPS}/sample_*.mp4"))
    frames = PIPELINE_ARGS.get(json.loads((model / "model_index.json").read_text())["_class_name"], {})
    if "num_frames" not in frames:
        assert not videos
        return
    assert videos, "no validation videos"
    for path in videos:
        assert read_frames(path).shape == (frames["num_frames"], 3, 32, 32)
        if name in SOUND:
            wave, rate = read_audio(path)
            assert (wave.shape[0], rate) == SOUND[name] and float(wave.abs().max()) > 0
        else:
            with pytest.raises(ValueError, match="has no audio stream"):
                read_audio(path)


def test_one_replica_one_rank_trains_logs_and_syncs(one):
    run, records, model, name = one
    check_summary(run, model, STEPS)
    check_videos(run, model, name)
    check_run(
        run,
        records,
        STEPS,
        extra_keys=("timing_s/old_log_prob", "old_log_prob/rollout_diff_max", "rollout/requests_per_engine_batch"),
        merged_lora="actor_rollout_ref.model.lora.merge=true" in MODEL_ARGS.get(name, ()),
    )
    for record in records[1:]:
        assert record["data"]["old_log_prob/rollout_diff_max"] <= LOGPROB_BOUND
        assert all(math.isfinite(v) for v in record["data"].values() if isinstance(v, float)), record["data"]
        # the step's two group requests (validation's are not counted), in one batch or two (arrival timing)
        batches, per_batch = (
            record["data"]["rollout/engine_batches"],
            record["data"]["rollout/requests_per_engine_batch"],
        )
        # on CPU one request per transformer batch (reproducible numerics, CPU_MAX_BATCH_REQUESTS)
        assert (batches, per_batch) == (2, 1), (batches, per_batch)


def test_max_actor_ckpt_to_keep_keeps_only_the_newest_complete_checkpoint(one):
    run, *_ = one
    assert sorted(p.name for p in run.glob("global_step_*")) == [f"global_step_{STEPS}"]
    assert run_dir.checkpoint_problem(run / f"global_step_{STEPS}", world_size=1) is None
    assert (run / run_dir.TRACKER_FILE).read_text() == str(STEPS)
    assert not (run / run_dir.LOCK_FILE).exists(), "the run releases its lock when it ends"

"""The Wan2.2 I2V-A14B training adapter against diffusers' own ``WanImageToVideoPipeline`` (CPU, fp32, tiny model).

The reference sampler is diffusers' pipeline itself (its prompt encoding, the source image's first-frame condition
concatenated on channels, the expert switch at the boundary, CFG per expert) with a scheduler whose ``step`` is the
shared SDE step and records what a rollout records, and whose schedule is the one the rollout samples with
(vLLM-Omni's Euler: σ = shift(1 − i/T)). From diffusers' own conditioning (its prompt embeddings and the condition its
``prepare_latents`` returns) the adapter must give the velocity each expert gave (≤ 1e-5) and replay the sampled
log-probs (≤ 1e-5). A saved LoRA loads into both experts of the pipeline and each expert's LoRA changes the video.

The rollout side (vLLM-Omni's pipeline in the real engine, replayed ≤ 1e-5) is
``tests/workers/rollout/vllm_omni/test_diffusers_rollout_engine.py`` (``wan2_2_i2v_a14b``).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from verl_omni.pipelines.wan2_2.training_adapter import EXPERTS, Wan22A14BTrainingAdapter
from verl_omni.pipelines.wan2_2_i2v.training_adapter import Wan22I2VA14BTrainingAdapter

ADAPTER = Wan22I2VA14BTrainingAdapter
PROMPT = "a red apple rolls off a table"
# 4 steps at shift 5: timesteps 1000, 937.5, 833.3, 625; the boundary 900 hands steps 2 and 3 to transformer_2
STEPS, HEIGHT, WIDTH, FRAMES, WINDOW, NOISE_LEVEL, CFG = 4, 32, 64, 5, 2, 0.7, 3.5
# sample 0's window is steps 0-1 (both high-noise), sample 1's steps 1-2 (one step per expert)
WINDOW_STARTS = (0, 1)


def _source_image(seed: int = 0):
    from PIL import Image

    rng = np.random.RandomState(seed)
    return Image.fromarray(rng.randint(0, 256, (24, 40, 3), dtype=np.uint8))


class RecordingSDEScheduler:
    """Mixin for the pipeline's scheduler: the rollout's Euler schedule, and ``step`` the shared SDE step inside each
    sample's window, recording latents, log-probs, timesteps and the guided velocity the pipeline passed in."""

    def arm(self, levels: torch.Tensor, generators: list[torch.Generator]):
        self.levels, self.generators, self.calls = levels, generators, 0
        self.rec = {k: [[] for _ in generators] for k in ("latents", "log_probs", "timesteps", "velocities")}

    def set_timesteps(self, num_inference_steps=None, device=None, **kwargs):
        super().set_timesteps(sigmas=np.linspace(1.0, 0.0, num_inference_steps + 1)[:-1], device=device)

    def step(self, model_output, timestep, sample, return_dict=False, **kwargs):
        from verl_omni.pipelines.schedulers import sde_step_with_logprob

        levels = self.levels[:, self.calls]
        self.calls += 1
        out = sde_step_with_logprob(self, model_output, timestep, sample, levels, generator=self.generators)
        for b, level in enumerate(levels.tolist()):
            if level > 0:
                if not self.rec["latents"][b]:
                    self.rec["latents"][b].append(sample[b].float())
                self.rec["latents"][b].append(out.prev_sample[b].float())
                self.rec["log_probs"][b].append(out.log_prob[b])
                self.rec["timesteps"][b].append(torch.as_tensor(timestep, dtype=torch.float32).reshape(()))
                self.rec["velocities"][b].append(model_output[b].float())
        return (out.prev_sample.to(sample.dtype),)


@pytest.fixture(scope="module")
def tiny_path(tiny_model):
    return tiny_model("wan2_2_i2v_a14b")


@pytest.fixture(scope="module")
def pipe(tiny_path):
    from diffusers import WanImageToVideoPipeline

    pipe = WanImageToVideoPipeline.from_pretrained(tiny_path)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def recorded(pipe, tiny_path):
    """Two videos of one prompt and source image sampled by diffusers' pipeline with SDE windows, and the
    conditioning diffusers computed for them, as the rollout records it."""
    from verl_omni.pipelines.sampling import SamplingSpec
    from verl_omni.pipelines.schedulers import FlowMatchSDEDiscreteScheduler, window_noise_levels

    stock_scheduler, stock_prepare = pipe.scheduler, pipe.prepare_latents
    scheduler_cls = type("Recording", (RecordingSDEScheduler, FlowMatchSDEDiscreteScheduler), {})
    pipe.scheduler = scheduler_cls(num_train_timesteps=1000, shift=5.0)
    levels = torch.tensor([window_noise_levels(STEPS, start, WINDOW, NOISE_LEVEL) for start in WINDOW_STARTS])
    pipe.scheduler.arm(levels, [torch.Generator().manual_seed(100 + s) for s in WINDOW_STARTS])
    conditions = []

    def prepare_latents(*args, **kwargs):
        latents, condition = stock_prepare(*args, **kwargs)
        conditions.append(condition)
        return latents, condition

    pipe.prepare_latents = prepare_latents
    try:
        video = pipe(
            image=_source_image(),
            prompt=PROMPT,
            height=HEIGHT,
            width=WIDTH,
            num_frames=FRAMES,
            num_inference_steps=STEPS,
            guidance_scale=CFG,
            guidance_scale_2=CFG,
            num_videos_per_prompt=len(WINDOW_STARTS),
            generator=[torch.Generator().manual_seed(s) for s in WINDOW_STARTS],
            output_type="pt",
        ).frames
        rec = {k: torch.stack([torch.stack(v) for v in vs]) for k, vs in pipe.scheduler.rec.items()}
        sigmas = pipe.scheduler.sigmas.clone()
    finally:
        pipe.scheduler, pipe.prepare_latents = stock_scheduler, stock_prepare
    with torch.no_grad():
        positive, negative = pipe.encode_prompt(PROMPT, "", num_videos_per_prompt=len(WINDOW_STARTS), device="cpu")
    (condition,) = conditions
    batch = {
        "all_latents": rec["latents"],
        "all_timesteps": rec["timesteps"],
        # diffusers' embeddings are zero past the prompt's tokens already: all of them count
        "prompt_embeds": positive,
        "prompt_embeds_mask": torch.ones(positive.shape[:2], dtype=torch.long),
        "negative_prompt_embeds": negative,
        "negative_prompt_embeds_mask": torch.ones(negative.shape[:2], dtype=torch.long),
        "image_condition": condition,
    }
    spec = SamplingSpec.resolve(
        dict(
            num_inference_steps=STEPS,
            height=HEIGHT,
            width=WIDTH,
            num_frames=FRAMES,
            noise_level=NOISE_LEVEL,
            true_cfg_scale=CFG,
            sde_window_size=WINDOW,
        ),
        ADAPTER,
    )
    return {"batch": batch, "rec": rec, "spec": spec, "video": video, "sigmas": sigmas}


@pytest.fixture(scope="module")
def experts(tiny_path):
    return ADAPTER.build_module(tiny_path).eval()


def test_registered_for_the_two_expert_checkpoint_with_its_facts(tiny_path, tmp_path):
    from verl_omni.pipelines.model_base import get_model_adapter

    assert get_model_adapter(tiny_path) is ADAPTER
    index = json.loads((tiny_path / "model_index.json").read_text())
    assert ADAPTER.boundary_ratio == index["boundary_ratio"] and ADAPTER.lora_file_pipeline == index["_class_name"]
    assert ADAPTER.vae_scale_factor(tiny_path) == 8 and ADAPTER.latent_multiple == 16
    assert ADAPTER.lora_components == EXPERTS and ADAPTER.max_source_images == 1
    # a one-transformer image-to-video checkpoint conditions otherwise: refused, naming the key and what is built
    (tmp_path / "transformer").mkdir()
    with pytest.raises(ValueError, match=r"model.path=.*without transformer_2/.*Wan2.2-I2V-A14B-Diffusers"):
        ADAPTER.for_checkpoint(tmp_path)


def test_the_pipeline_samples_a_video_from_the_tiny_directory(recorded):
    video = recorded["video"]
    assert video.shape == (len(WINDOW_STARTS), FRAMES, 3, HEIGHT, WIDTH)
    assert bool(torch.isfinite(video).all()) and float(video.std()) > 0
    # the windows as meant: sample 1's second recorded step is past the boundary
    high = ADAPTER.high_noise(recorded["batch"]["all_timesteps"])
    assert high.tolist() == [[True, True], [True, False]]


def test_adapter_schedule_is_the_sampled_one(tiny_path, recorded):
    scheduler = ADAPTER.build_scheduler(tiny_path)
    ADAPTER.set_schedule(scheduler, recorded["spec"], 0)
    torch.testing.assert_close(scheduler.sigmas, recorded["sigmas"], rtol=0, atol=1e-7)


def one_transformer(transformer, batch, step, spec) -> torch.Tensor:
    """Every sample's velocity at ``step`` from ``transformer`` (the adapter's one-transformer path, condition and
    CFG included)."""
    return super(Wan22A14BTrainingAdapter, ADAPTER).step_velocity(transformer, batch, step, spec, 8)


def test_each_experts_velocity_is_diffusers_given_diffusers_condition(experts, recorded):
    """Each expert gives diffusers' guided velocity at the steps diffusers gave it (the other expert another), and
    the two-expert module routes every recorded step to its expert; without the condition the velocity changes."""
    batch, spec, velocities = recorded["batch"], recorded["spec"], recorded["rec"]["velocities"]
    with torch.no_grad():
        for step in range(WINDOW):
            high = ADAPTER.high_noise(batch["all_timesteps"][:, step])
            for expert, rows in zip(EXPERTS, (high, ~high), strict=True):
                if bool(rows.any()):
                    alone = one_transformer(getattr(experts, expert), batch, step, spec)
                    torch.testing.assert_close(alone[rows], velocities[rows, step], rtol=0, atol=1e-5)
                    other = getattr(experts, EXPERTS[1 - EXPERTS.index(expert)])
                    assert (one_transformer(other, batch, step, spec)[rows] - alone[rows]).abs().max() > 1e-3
            routed = ADAPTER.step_velocity(experts, batch, step, spec, 8)
            torch.testing.assert_close(routed, velocities[:, step], rtol=0, atol=1e-5)
        blank = dict(batch, image_condition=torch.zeros_like(batch["image_condition"]))
        assert (ADAPTER.step_velocity(experts, blank, 0, spec, 8) - velocities[:, 0]).abs().max() > 1e-3


def test_replay_reproduces_the_samplers_log_probs(experts, tiny_path, recorded):
    from verl_omni.workers.utils.replay import check_replay_batch, prepare_scheduler, replay_step

    batch, spec = recorded["batch"], recorded["spec"]
    check_replay_batch(batch, spec, ADAPTER)
    scheduler = ADAPTER.build_scheduler(tiny_path)
    prepare_scheduler(ADAPTER, scheduler, spec, ADAPTER.schedule_seq_len(batch["all_latents"][:, 0]))
    with torch.no_grad():
        replayed = torch.stack(
            [replay_step(ADAPTER, experts, scheduler, batch, j, spec, 8).log_prob for j in range(WINDOW)], dim=1
        )
    assert bool(torch.isfinite(recorded["rec"]["log_probs"]).all())
    assert (replayed - recorded["rec"]["log_probs"]).abs().max() <= 1e-5


def test_saved_lora_loads_into_both_experts_of_diffusers_pipeline_and_changes_the_video(pipe, tiny_path, tmp_path):
    from peft import LoraConfig

    from verl_omni.workers.engine.fsdp.checkpoint import (
        ADAPTER_NAME,
        gather_lora_state_dict,
        lora_load_calls,
        save_lora_dir,
    )

    module = ADAPTER.build_module(tiny_path)
    torch.manual_seed(0)
    module.add_adapter(
        LoraConfig(r=4, lora_alpha=8, target_modules=list(ADAPTER.lora_target_modules), init_lora_weights=False)
    )
    lora = gather_lora_state_dict(module)
    save_lora_dir(ADAPTER, tmp_path / "lora", lora, module.peft_config[ADAPTER_NAME].to_dict())

    from diffusers import WanImageToVideoPipeline

    pipe = WanImageToVideoPipeline.from_pretrained(tiny_path)
    pipe.set_progress_bar_config(disable=True)
    for kwargs in lora_load_calls(tmp_path / "lora"):
        pipe.load_lora_weights(tmp_path / "lora", **kwargs)
    for expert in EXPERTS:
        loaded = {
            name.replace(".default_0", ""): p for name, p in getattr(pipe, expert).named_parameters() if "lora_" in name
        }
        mine = {n[len(expert) + 1 :]: t for n, t in lora.items() if n.startswith(f"{expert}.")}
        assert mine and loaded.keys() == mine.keys()
        for name, tensor in mine.items():
            torch.testing.assert_close(loaded[name].detach(), tensor, rtol=0, atol=0)

    # UniPC's 2 steps are timesteps 999 and 833: one per expert, so each expert's LoRA shows
    kwargs = dict(image=_source_image(), prompt=PROMPT, height=32, width=32, num_frames=5, num_inference_steps=2)

    def sample():
        return pipe(generator=torch.Generator().manual_seed(0), output_type="pt", **kwargs).frames

    tuned = sample()
    for expert in EXPERTS:
        getattr(pipe, expert).disable_adapters()
        without = sample()
        getattr(pipe, expert).enable_adapters()
        assert (tuned - without).abs().max() > 1e-4, f"{expert}'s LoRA does not change the video"
    pipe.disable_lora()
    assert bool(torch.isfinite(tuned).all()) and (tuned - sample()).abs().max() > 1e-4


def test_builder_is_deterministic_per_seed_and_small(tiny_path, tmp_path):
    from verl_omni.utils.tiny_models import build_tiny_model, directory_digest

    again = build_tiny_model("wan2_2_i2v_a14b", tmp_path / "same", seed=0)
    assert directory_digest(again) == directory_digest(tiny_path)
    assert sum(f.stat().st_size for f in tiny_path.rglob("*") if f.is_file()) < 8 * 2**20

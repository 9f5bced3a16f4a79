"""The LTX-2 training adapter against the tiny checkpoint, diffusers' ``LTX2Pipeline`` and vLLM-Omni's schedule.

The rollout ↔ replay check on the real engine (≤ 1e-5 over the joint video + audio latent) is
``test_diffusers_rollout_engine.py``, parametrized over ltx2; here the adapter's velocity is checked against
diffusers' own pipeline: its two per-stream scheduler steps are recorded (the velocity each stream steps with, after
the pipeline's x0-space CFG) and must be what ``step_velocity`` predicts for the joint latent.
"""

from __future__ import annotations

import json

import pytest
import torch

from verl_omni.pipelines.ltx2.training_adapter import LTX2TrainingAdapter

HEIGHT, WIDTH, FRAMES, STEPS = 32, 64, 9, 3


@pytest.fixture(scope="module")
def tiny_ltx2(tiny_model):
    return tiny_model("ltx2")


@pytest.fixture(scope="module")
def pipe(tiny_ltx2):
    from diffusers import LTX2Pipeline

    pipe = LTX2Pipeline.from_pretrained(tiny_ltx2)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_registered_with_the_checkpoints_compression_and_frame_rate(tiny_ltx2, pipe):
    from verl_omni.pipelines.model_base import get_model_adapter

    assert get_model_adapter(tiny_ltx2) is LTX2TrainingAdapter
    assert LTX2TrainingAdapter.vae_scale_factor(tiny_ltx2) == pipe.vae_spatial_compression_ratio == 32
    assert LTX2TrainingAdapter.latent_multiple == 32 * pipe.transformer.config.patch_size
    assert LTX2TrainingAdapter.frame_multiple == pipe.vae_temporal_compression_ratio
    index = json.loads((tiny_ltx2 / "model_index.json").read_text())
    assert LTX2TrainingAdapter.lora_file_pipeline == index["_class_name"]


@pytest.mark.parametrize("steps", [4, 40])
def test_the_schedule_is_the_releases_and_starts_at_exactly_one(tiny_ltx2, steps):
    """The adapter's σ are vLLM-Omni's official LTX-2 schedule (shift pinned at max_shift, terminal stretch 0.1) to
    fp32 rounding, except that σ₀ is exactly 1 (vLLM-Omni's fp32 arithmetic gives 1 − 2e-7, where the SDE std
    √(σ/(1 − σ)) would not take the σ = 1 branch); the rollout pipeline steps with these."""
    from diffusers import FlowMatchEulerDiscreteScheduler
    from vllm_omni.diffusion.models.ltx2.ltx2_denoise import _official_ltx_sigmas

    from verl_omni.pipelines.sampling import SamplingSpec

    scheduler = LTX2TrainingAdapter.build_scheduler(tiny_ltx2)
    LTX2TrainingAdapter.set_schedule(scheduler, SamplingSpec(num_inference_steps=steps, sde_window_size=1), 0)
    official = _official_ltx_sigmas(
        FlowMatchEulerDiscreteScheduler.from_pretrained(tiny_ltx2, subfolder="scheduler"), steps, "cpu"
    )
    torch.testing.assert_close(scheduler.sigmas, official, rtol=0, atol=1e-6)
    assert float(scheduler.sigmas[0]) == 1.0 and float(scheduler.sigmas[-2]) == pytest.approx(0.1)
    torch.testing.assert_close(scheduler.timesteps, scheduler.sigmas[:-1] * 1000, rtol=0, atol=1e-3)


def test_fsdp_blocks_and_lora_targets_name_every_attention_of_the_transformer(pipe):
    classes = {type(m).__name__ for m in pipe.transformer.modules()}
    assert set(LTX2TrainingAdapter.fsdp_wrap_blocks) <= classes
    names = [n for n, _ in pipe.transformer.named_modules()]
    attentions = ("attn1", "attn2", "audio_attn1", "audio_attn2", "audio_to_video_attn", "video_to_audio_attn")
    for target in LTX2TrainingAdapter.lora_target_modules:
        for attention in attentions:
            assert any(n.endswith(f".{attention}.{target}") for n in names), (attention, target)


def test_prompt_ids_are_the_pipelines_unpadded_gemma_ids(pipe):
    tokenizer = pipe.tokenizer
    ids = LTX2TrainingAdapter.prompt_token_ids(tokenizer, "  a red cat on a chair ")
    assert ids == tokenizer("a red cat on a chair").input_ids
    assert ids[0] == tokenizer.bos_token_id and tokenizer.pad_token_id not in ids
    assert LTX2TrainingAdapter.prompt_token_ids(tokenizer, "") == [tokenizer.bos_token_id]


def test_the_rollouts_conditioning_from_prompt_ids_is_the_pipelines_from_text(pipe):
    """The rollout pipeline's ``conditioning`` (the adapter's ids, left-padded to 1024, through Gemma 3 and the text
    connectors) gives the contexts diffusers' ``LTX2Pipeline`` makes from the text, the empty negative prompt
    included, one row per sample. Run on the diffusers components (the method reads only them)."""
    from types import SimpleNamespace

    from verl_omni.pipelines.diffusers_rollout import DiffusersRolloutMixin
    from verl_omni.pipelines.ltx2.rollout_pipeline import LTX2LogProbPipeline

    prompt = "a red cat on a chair"
    ids = LTX2TrainingAdapter.prompt_token_ids(pipe.tokenizer, prompt)
    requests = [SimpleNamespace(prompt_token_ids=ids, negative_prompt_token_ids=None, num_samples=2)]
    parts = ("tokenizer", "text_encoder", "connectors")
    host = SimpleNamespace(**{k: getattr(pipe, k) for k in parts}, device=torch.device("cpu"))
    host.per_sample = DiffusersRolloutMixin.per_sample
    with torch.no_grad():
        cond = LTX2LogProbPipeline.conditioning(host, requests, negative=False)
        cond |= LTX2LogProbPipeline.conditioning(host, requests, negative=True)
        embeds, mask, negative, negative_mask = pipe.encode_prompt(prompt, "", device="cpu")
        video, audio, _ = pipe.connectors(embeds, mask)
        negative_video, negative_audio, _ = pipe.connectors(negative, negative_mask)
    expected = {
        "prompt_embeds": video,
        "audio_prompt_embeds": audio,
        "negative_prompt_embeds": negative_video,
        "negative_audio_prompt_embeds": negative_audio,
    }
    for key, value in expected.items():
        assert cond[key].shape == (2, 1024, value.shape[-1]), key
        torch.testing.assert_close(cond[key], value.expand(2, -1, -1), rtol=0, atol=1e-6, msg=key)
    assert not torch.equal(cond["prompt_embeds"], cond["negative_prompt_embeds"])


def _recorded_pipeline_velocities(pipe, guidance: dict):
    """The velocities (and the latents they step) of each stream's scheduler steps of one diffusers run, and
    the connectors' contexts the transformer read."""
    steps, contexts = [], {}
    scheduler_step = type(pipe.scheduler).step

    def recording_step(self, model_output, timestep, sample, *args, **kwargs):
        steps.append((model_output.detach().clone(), sample.detach().clone(), float(timestep)))
        return scheduler_step(self, model_output, timestep, sample, *args, **kwargs)

    def forward_hook(module, args, kwargs):
        contexts.setdefault("video", kwargs["encoder_hidden_states"].detach().clone())
        contexts.setdefault("audio", kwargs["audio_encoder_hidden_states"].detach().clone())

    handle = pipe.transformer.register_forward_pre_hook(forward_hook, with_kwargs=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(type(pipe.scheduler), "step", recording_step)
        pipe(
            prompt="a red cat on a chair",
            height=HEIGHT,
            width=WIDTH,
            num_frames=FRAMES,
            num_inference_steps=STEPS,
            generator=torch.Generator().manual_seed(0),
            output_type="latent",
            **guidance,
        )
    handle.remove()
    # per denoising step: the video stream's step, then the audio stream's
    return [(steps[2 * i], steps[2 * i + 1]) for i in range(STEPS)], contexts


@pytest.mark.parametrize("cfg", [True, False], ids=["cfg", "no_cfg"])
def test_step_velocity_is_the_pipelines_per_stream_guided_velocity_on_the_joint_latent(pipe, cfg):
    """diffusers' ``LTX2Pipeline`` (video CFG 3, audio CFG 7, x0-space, no STG / modality guidance / rescale) steps
    each stream with a velocity; the adapter, given the video tokens followed by the audio tokens and the
    connectors' contexts, predicts both at every step (≤ 5e-5, see below)."""
    from verl_omni.pipelines.sampling import SamplingSpec

    guidance = {"guidance_scale": 3.0, "audio_guidance_scale": 7.0} if cfg else {"guidance_scale": 1.0}
    steps, contexts = _recorded_pipeline_velocities(pipe, guidance)
    # the CFG batch is [negative, positive]
    half = contexts["video"].shape[0] // 2 if cfg else 0
    batch = {"prompt_embeds": contexts["video"][half:], "audio_prompt_embeds": contexts["audio"][half:]}
    if cfg:
        batch |= {
            "negative_prompt_embeds": contexts["video"][:half],
            "negative_audio_prompt_embeds": contexts["audio"][:half],
        }
    spec = SamplingSpec(
        num_inference_steps=STEPS,
        height=HEIGHT,
        width=WIDTH,
        num_frames=FRAMES,
        true_cfg_scale=3.0 if cfg else 1.0,
        model_kwargs={"audio_cfg_scale": 7.0},
    )
    for (v_video, video, t), (v_audio, audio, _) in steps:
        assert video.shape[1] == 2 * 1 * 2 and audio.shape[1] > 0 and video.shape[2] == audio.shape[2]
        joint = torch.cat([video, audio], dim=1)
        # one recorded step: its latent (and a stand-in for the next, which the velocity does not read)
        batch |= {"all_latents": torch.stack([joint, joint], dim=1), "all_timesteps": torch.tensor([[t]])}
        LTX2TrainingAdapter.check_latents(batch["all_latents"], batch["all_timesteps"])
        with torch.no_grad():
            predicted = LTX2TrainingAdapter.step_velocity(pipe.transformer, batch, 0, spec, 32)
        # diffusers runs both CFG passes in one batch and takes σ from its table: fp32 rounding of x − σv, times the
        # audio's scale 7, divided by σ (0.1 at the last step)
        torch.testing.assert_close(predicted, torch.cat([v_video, v_audio], dim=1).float(), rtol=0, atol=5e-5)


def test_a_joint_latent_without_audio_tokens_is_refused():
    from verl_omni.pipelines.sampling import SamplingSpec

    spec = SamplingSpec(num_inference_steps=4, height=HEIGHT, width=WIDTH, num_frames=FRAMES)
    with pytest.raises(ValueError, match="hold no audio after the 4 video tokens of 9 frames at 32x64"):
        LTX2TrainingAdapter.split_streams(torch.zeros(1, 4, 8), spec, 32)

"""vLLM-Omni LTX-2 pipeline that samples video and audio with the Flow-GRPO SDE step and records log-probs.

Named by ``LTX2TrainingAdapter.rollout_pipeline``; vLLM-Omni loads it as the custom pipeline of an
``LTX2Pipeline`` checkpoint. It keeps vLLM-Omni's components, latents (video drawn before audio from
each sample's generator), guidance passes and denoising loop (``run_phase``, on the σ the adapter
sets, :meth:`LTX2LogProbPipeline._schedule`), and replaces one thing: the step. vLLM-Omni steps the
two streams with one Euler update each on the same σ; here :meth:`_denoise_step` hands the recorder
the concatenated video and audio tokens and their guided velocities, so that one SDE step (and its
log-prob) covers both streams, and splits the result back. The guidance is vLLM-Omni's with CFG
only: the video at ``true_cfg_scale``, the audio at ``audio_cfg_scale`` (``model_kwargs``); its STG,
modality guidance and rescale stay off (the replay computes the same, ``training_adapter``).

The prompt ids are Gemma 3 ids (``LTX2TrainingAdapter.prompt_token_ids``), left-padded to 1024 tokens
as the stock encoder pads text; the connectors' video and audio contexts are what is recorded per
sample and what the denoising reads (``prompt_embeds``, ``audio_prompt_embeds`` and, with CFG, the
negatives). The outputs per request: final uint8 video pixels ``[N, 3, F, H, W]``, the vocoder's
waveforms ``[N, channels, samples]`` in [-1, 1] with their sample rate (``rollout_output``), and the
trajectory, whose ``all_latents`` are the joint tokens ``[N, W+1, S_v + S_a, C]``.
"""

from __future__ import annotations

import copy

import torch
from vllm_omni.diffusion.models.ltx2.ltx2_conditioning import LTXPromptContext
from vllm_omni.diffusion.models.ltx2.ltx2_guidance import LTXGuidanceSpec, LTXModalityGuidance
from vllm_omni.diffusion.models.ltx2.ltx2_latents import LTXAVState
from vllm_omni.diffusion.models.ltx2.ltx2_request import LTXRequestInputs
from vllm_omni.diffusion.models.ltx2.pipeline_ltx2 import LTX2Pipeline

from verl_omni.pipelines.diffusers_rollout import DiffusersRolloutMixin
from verl_omni.pipelines.ltx2.training_adapter import (
    DEFAULT_AUDIO_CFG_SCALE,
    NUM_TRAIN_TIMESTEPS,
    TEXT_LENGTH,
    LTX2TrainingAdapter,
)
from verl_omni.pipelines.recorder import RolloutRecorder
from verl_omni.pipelines.rollout_request import RolloutRequest
from verl_omni.pipelines.schedulers.flow_match_sde import schedule_sigmas


class LTX2LogProbPipeline(DiffusersRolloutMixin, LTX2Pipeline):
    """LTX-2 rollout pipeline: token ids in; videos with their audio, joint SDE trajectories and log-probs out."""

    def __init__(self, *, od_config, prefix: str = ""):
        super().__init__(od_config=od_config, prefix=prefix)
        self._check_model_facts()
        #: the recorder of the rollout batch in flight (None: the stock loop, e.g. the engine's warm-up)
        self._recorder: RolloutRecorder | None = None

    def _check_model_facts(self) -> None:
        """The checkpoint's VAE compression must be what the adapter validates sizes and replays with."""
        facts = {
            "latent_multiple": self.vae_spatial_compression_ratio * self.transformer_spatial_patch_size,
            "frame_multiple": self.vae_temporal_compression_ratio * self.transformer_temporal_patch_size,
        }
        wrong = {k: v for k, v in facts.items() if getattr(LTX2TrainingAdapter, k) != v}
        if wrong:
            raise ValueError(
                f"{self.od_config.model}: its VAE and transformer give {wrong}, LTX2TrainingAdapter declares "
                f"{ {k: getattr(LTX2TrainingAdapter, k) for k in wrong} }"
            )

    def conditioning(self, requests: list[RolloutRequest], negative: bool) -> dict[str, torch.Tensor]:
        """``[N, 1024, D]`` video and audio contexts of each request's ids (the empty prompt's for a missing
        negative), per sample: Gemma 3's stacked hidden states of the left-padded ids through the connectors."""
        tokenizer = self.tokenizer
        empty = LTX2TrainingAdapter.prompt_token_ids(tokenizer, "")
        rows = [(r.negative_prompt_token_ids or empty) if negative else r.prompt_token_ids for r in requests]
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        ids = torch.full((len(rows), TEXT_LENGTH), pad, dtype=torch.long)
        mask = torch.zeros(ids.shape, dtype=torch.long)
        for i, row in enumerate(rows):
            row = row[:TEXT_LENGTH]
            ids[i, TEXT_LENGTH - len(row) :], mask[i, TEXT_LENGTH - len(row) :] = torch.tensor(row), 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        hidden = self.text_encoder(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        embeds = torch.stack(hidden, dim=-1).flatten(2, 3).to(self.text_encoder.dtype)
        video, audio, _ = self.connectors(embeds, mask, padding_side="left")
        prefix = "negative_" if negative else ""
        return {
            f"{prefix}prompt_embeds": self.per_sample(video, requests),
            f"{prefix}audio_prompt_embeds": self.per_sample(audio, requests),
        }

    @staticmethod
    def _guidance(spec) -> LTXGuidanceSpec:
        """CFG per stream (video ``true_cfg_scale``, audio ``audio_cfg_scale``), nothing else; none without CFG."""
        if not spec.uses_cfg:
            return LTXGuidanceSpec.positive_only()
        audio = float(spec.model_kwargs.get("audio_cfg_scale", DEFAULT_AUDIO_CFG_SCALE))
        return LTXGuidanceSpec(
            video=LTXModalityGuidance(cfg_scale=spec.true_cfg_scale), audio=LTXModalityGuidance(cfg_scale=audio)
        )

    def _prompt_context(self, cond: dict[str, torch.Tensor], uses_cfg: bool) -> LTXPromptContext:
        """The denoising's contexts, already encoded (every token valid: the connectors' registers fill the padding)."""
        video, audio = cond["prompt_embeds"], cond["audio_prompt_embeds"]
        mask = torch.ones(video.shape[:2], dtype=torch.long, device=video.device)
        negative = (cond["negative_prompt_embeds"], cond["negative_audio_prompt_embeds"]) if uses_cfg else (None, None)
        return LTXPromptContext(
            batch_size=video.shape[0],
            connector_prompt_embeds=video,
            connector_audio_prompt_embeds=audio,
            connector_attention_mask=mask,
            positive_connector_prompt_embeds=video,
            positive_connector_audio_prompt_embeds=audio,
            positive_connector_attention_mask=mask,
            negative_connector_prompt_embeds=negative[0],
            negative_connector_audio_prompt_embeds=negative[1],
            negative_connector_attention_mask=mask if uses_cfg else None,
        )

    def rollout_forward(self, req):
        requests, spec, cond = self.conditioned_batch(req)
        recorder = RolloutRecorder(requests, self.device)
        # the release's schedule, set on the recorder first: the loop then runs the recorder's (possibly thinned) σ
        sigmas = self._schedule(spec)
        recorder.set_schedule(sigmas, sigmas[:-1] * NUM_TRAIN_TIMESTEPS)
        inputs = LTXRequestInputs(
            prompt=None,
            negative_prompt=None,
            height=spec.height,
            width=spec.width,
            num_frames=spec.num_frames,
            frame_rate=float(LTX2TrainingAdapter.video_fps),
            num_inference_steps=len(recorder.loop_timesteps),
            guidance=self._guidance(spec),
            num_videos_per_prompt=1,
            generator=recorder.generators,
            latents=None,
            audio_latents=None,
            prompt_embeds=None,
            negative_prompt_embeds=None,
            prompt_attention_mask=None,
            negative_prompt_attention_mask=None,
            decode_timestep=0.0,
            decode_noise_scale=None,
            output_type="pt",
            max_sequence_length=TEXT_LENGTH,
        )
        self._recorder = recorder
        try:
            phase = self.run_phase(
                req,
                inputs,
                noise_scale=0.0,
                sigmas=recorder.sigmas.tolist(),
                timesteps=None,
                attention_kwargs=None,
                phase_recipe=self.pipeline_recipe.phases[0],
                prompt_context=self._prompt_context(cond, spec.uses_cfg),
            )
        finally:
            self._recorder = None
        videos, waveforms = self._decode(phase.video, phase.audio)
        rate = int(self.vocoder.config.output_sampling_rate)
        return self.rollout_outputs(recorder, videos, cond, packed=True, audio=waveforms, audio_sample_rate=rate)

    def _schedule(self, spec) -> torch.Tensor:
        """σ ``[T+1]`` of the release's schedule as the adapter sets it (diffusers' ``LTX2Pipeline`` computation, on
        a copy of this pipeline's scheduler). vLLM-Omni's own fp32 computation of the same schedule starts at
        σ = 1 − 2·10⁻⁷ instead of 1, where the SDE step's std √(σ/(1 − σ)) is three orders of magnitude off the
        σ = 1 case's (which uses σ₁ in the denominator): the first step would sample from noise of scale ~10³."""
        scheduler = copy.deepcopy(self.scheduler)
        LTX2TrainingAdapter.set_schedule(scheduler, spec, 0)
        return schedule_sigmas(scheduler, self.device)

    def _check_forward_inputs(self, request_inputs, image=None) -> None:
        """The stock text checks, except in a rollout: its prompts arrive encoded (the sampling spec was checked)."""
        if self._recorder is None:
            super()._check_forward_inputs(request_inputs, image=image)

    def _denoise_step(self, index, timestep, state, forward_ctx, denoise_ctx):
        """vLLM-Omni's step with the recorder's joint update: video and audio tokens stepped as one latent."""
        recorder = self._recorder
        if recorder is None:
            return super()._denoise_step(index, timestep, state, forward_ctx, denoise_ctx)
        denoise_ctx.latents, denoise_ctx.audio_latents = state.video, state.audio
        v_video, v_audio = self._predict_noise_for_step(index, timestep, state, forward_ctx, denoise_ctx)
        if state.video.shape[2] != state.audio.shape[2]:
            raise ValueError(
                f"{self.od_config.model}: video tokens of {state.video.shape[2]} channels and audio tokens of "
                f"{state.audio.shape[2]} (latent channels x latent mel bins): the joint latent needs them equal"
            )
        joint = recorder.step(
            torch.cat([v_video, v_audio], dim=1).to(state.video.dtype), torch.cat([state.video, state.audio], dim=1)
        )
        video_tokens = state.video.shape[1]
        return LTXAVState(video=joint[:, :video_tokens], audio=joint[:, video_tokens:])

    def _decode(self, latents: torch.Tensor, audio_latents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Denormalized latents → videos ``[N, 3, F, H, W]`` in [-1, 1] and waveforms ``[N, channels, samples]``, as
        the stock decode makes them (decode timestep 0, no decode noise)."""
        timestep = None
        if self.vae.config.timestep_conditioning:
            timestep = torch.zeros(latents.shape[0], device=latents.device, dtype=latents.dtype)
        videos = self.vae.decode(latents.to(self.vae.dtype), timestep, return_dict=False)[0]
        mel = self.audio_vae.decode(audio_latents.to(self.audio_vae.dtype), return_dict=False)[0]
        return videos, self.vocoder(mel).float()

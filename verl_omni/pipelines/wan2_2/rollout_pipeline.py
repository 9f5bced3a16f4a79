"""vLLM-Omni Wan2.2 text-to-video pipeline that samples with the Flow-GRPO SDE step and records log-probs.

Named by ``Wan22TrainingAdapter.rollout_pipeline``; vLLM-Omni loads it as the custom pipeline of a
``WanPipeline`` checkpoint. It keeps vLLM-Omni's transformer, VAE, latents and denoising loop
(``diffuse``: classic CFG through ``CFGParallelMixin``, each step through ``self.scheduler.step``)
and runs that loop inside ``recorder.recording(self)``, on vLLM-Omni's Euler scheduler with the
checkpoint's flow shift (its default UniPC multistep solver has no single-step SDE form).
``forward`` is overridden to take token ids, serve several requests per transformer batch, give
every sample its own seed, and return videos and trajectories
(:mod:`verl_omni.pipelines.diffusers_rollout`).

The prompt ids are the UMT5 ids of ``Wan22TrainingAdapter.prompt_token_ids``, encoded here as the
stock ``encode_prompt`` encodes text (padded to 512 tokens, masked, padding rows zeroed). Recorded
per sample: ``all_latents`` ``[W+1, C, F', h, w]`` (unpacked), ``prompt_embeds`` ``[L, D]`` +
``prompt_embeds_mask`` ``[L]`` and, with CFG, the negatives (the empty prompt unless one is sent).
The videos leave as final uint8 pixels ``[N, 3, F, H, W]`` (``pipelines/rollout_output.py``; off that
path, as ``[N, 3, F, H, W]`` in [-1, 1], which vLLM-Omni's Wan post-process turns into ``[N, F, H, W, 3]``
arrays in [0, 1]); ``engine.unpack_request_output`` gives each sample uint8 ``[F, 3, H, W]``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from vllm_omni.diffusion.models.wan2_2.pipeline_wan2_2 import Wan22Pipeline, build_wan_scheduler

from verl_omni.pipelines.diffusers_rollout import DiffusersRolloutMixin
from verl_omni.pipelines.model_base import get_model_adapter
from verl_omni.pipelines.recorder import RolloutRecorder
from verl_omni.pipelines.rollout_request import RolloutRequest
from verl_omni.pipelines.schedulers.flow_match_sde import schedule_sigmas
from verl_omni.pipelines.wan2_2.training_adapter import (
    NUM_TRAIN_TIMESTEPS,
    TEXT_LENGTH,
    Wan22TrainingAdapter,
    flow_shift,
    padded_text,
)

# videos per VAE decode call: the Wan2.2 VAE's activations grow with the videos decoded at once, and a group's
# worth of 480p videos in one call does not fit an 80 GB GPU beside the 5B transformer
VAE_DECODE_CHUNK = 2


class Wan22LogProbPipeline(DiffusersRolloutMixin, Wan22Pipeline):
    """Wan2.2 text-to-video rollout pipeline: token ids in; videos, SDE trajectories and log-probs out."""

    def __init__(self, *, od_config, prefix: str = ""):
        super().__init__(od_config=od_config, prefix=prefix)
        # the TI2V-5B's adapter or the A14B's (two experts), as the trainer resolves it
        self.adapter = get_model_adapter(od_config.model)
        self._check_model_facts()
        # vLLM-Omni's single-step Euler scheduler (the stock default, UniPC, is a multistep solver)
        self.scheduler = build_wan_scheduler("euler", flow_shift(od_config.model))
        self._sample_solver, self._flow_shift = "euler", self.scheduler._shift

    def _check_model_facts(self) -> None:
        """The checkpoint's VAE, patch size and expert boundary must be those the adapter validates and replays with."""
        spatial = self.vae_scale_factor_spatial * self.transformer_config.patch_size[1]
        facts = {"latent_multiple": spatial, "frame_multiple": self.vae_scale_factor_temporal}
        if self.transformer_2 is not None:
            facts["boundary_ratio"] = self._boundary_ratio()
        adapter = self.adapter
        wrong = {k: v for k, v in facts.items() if getattr(adapter, k) != v}
        if wrong:
            raise ValueError(
                f"{self.od_config.model}: its VAE, transformer and model_index.json give {wrong}, {adapter.__name__} "
                f"declares { {k: getattr(adapter, k) for k in wrong} }"
            )

    def _boundary_ratio(self) -> float | None:
        """The expert boundary: the engine's ``boundary_ratio`` if set, else the checkpoint's ``model_index.json``."""
        if self.boundary_ratio is not None:
            return float(self.boundary_ratio)
        index = json.loads((Path(self.od_config.model) / "model_index.json").read_text())
        return None if index.get("boundary_ratio") is None else float(index["boundary_ratio"])

    def conditioning(self, requests: list[RolloutRequest], negative: bool) -> dict[str, torch.Tensor]:
        """``[N, L, D]`` embeddings of each request's ids (zero past its tokens) and their ``[N, L]`` mask, per sample."""
        empty = Wan22TrainingAdapter.prompt_token_ids(self.tokenizer, "")
        rows = [(r.negative_prompt_token_ids or empty) if negative else r.prompt_token_ids for r in requests]
        ids = torch.full((len(rows), TEXT_LENGTH), self.tokenizer.pad_token_id or 0, dtype=torch.long)
        mask = torch.zeros(ids.shape, dtype=torch.long)
        for i, row in enumerate(rows):
            row = row[:TEXT_LENGTH]
            ids[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), 1
        length = int(mask.sum(dim=1).max())
        ids, mask = ids.to(self.device), mask.to(self.device)
        hidden = self.text_encoder(ids, mask).last_hidden_state[:, :length]
        mask = mask[:, :length]
        embeds = (hidden * mask[..., None].to(hidden.dtype)).float()
        key = "negative_prompt_embeds" if negative else "prompt_embeds"
        return {key: self.per_sample(embeds, requests), f"{key}_mask": self.per_sample(mask, requests)}

    def rollout_forward(self, req):
        requests, spec, cond = self.conditioned_batch(req)
        recorder = RolloutRecorder(requests, self.device)
        latents = self.prepare_latents(
            recorder.num_samples,
            self.transformer_config.in_channels,
            spec.height,
            spec.width,
            spec.num_frames,
            torch.float32,
            self.device,
            recorder.generators,
        )
        return denoise_and_decode(self, recorder, latents, spec, cond)

    def _boundary_timestep(self) -> float | None:
        """Where ``diffuse`` hands over from ``transformer`` to ``transformer_2`` (None: one transformer)."""
        if self.transformer_2 is None:
            return None
        return self._boundary_ratio() * NUM_TRAIN_TIMESTEPS

    def _denormalize(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents ``[N, C, F', h, w]`` in the VAE's own scale (its per-channel mean and std), as the stock decode."""
        config = self.vae.config
        view = (1, config.z_dim, 1, 1, 1)
        mean = torch.tensor(config.latents_mean).view(view).to(latents.device, self.vae.dtype)
        std = torch.tensor(config.latents_std).view(view).to(latents.device, self.vae.dtype)
        return latents.to(self.vae.dtype) * std + mean


def denoise_and_decode(pipeline, recorder: RolloutRecorder, latents: torch.Tensor, spec, cond: dict, **stock_kwargs):
    """The rest of a Wan2.2 rollout once the noise is drawn, shared by text- and image-to-video: the schedule, the
    stock ``diffuse`` loop inside the recorder (``stock_kwargs``: what the image-to-video loop takes besides), and
    the decode in chunks of :data:`VAE_DECODE_CHUNK` videos."""
    dtype = pipeline.transformer.dtype
    text = padded_text(cond["prompt_embeds"], cond["prompt_embeds_mask"], dtype)
    negative = None
    if spec.uses_cfg:
        negative = padded_text(cond["negative_prompt_embeds"], cond["negative_prompt_embeds_mask"], dtype)
    pipeline.scheduler.set_timesteps(spec.num_inference_steps, device=pipeline.device)
    timesteps = pipeline.scheduler.timesteps
    recorder.set_schedule(schedule_sigmas(pipeline.scheduler, pipeline.device), timesteps)
    pipeline._num_timesteps, pipeline._guidance_scale = len(timesteps), spec.true_cfg_scale
    with recorder.recording(pipeline):
        latents = pipeline.diffuse(
            latents=latents,
            timesteps=recorder.loop_timesteps,
            prompt_embeds=text,
            negative_prompt_embeds=negative,
            guidance_low=spec.true_cfg_scale,
            guidance_high=spec.true_cfg_scale,
            boundary_timestep=pipeline._boundary_timestep(),
            dtype=dtype,
            attention_kwargs={},
            **stock_kwargs,
        )
    pipeline._current_timestep = None
    videos = torch.cat(
        [
            pipeline.vae.decode(chunk, return_dict=False)[0]
            for chunk in pipeline._denormalize(latents).split(VAE_DECODE_CHUNK)
        ]
    )
    return pipeline.rollout_outputs(recorder, videos, cond, packed=True)

"""vLLM-Omni Z-Image pipeline that samples with the Flow-GRPO SDE step and records log-probs.

Named by ``ZImageTrainingAdapter.rollout_pipeline``; vLLM-Omni loads it as the custom pipeline of a
``ZImagePipeline`` checkpoint. It reuses vLLM-Omni's text encoder (Qwen3, second-to-last hidden
states of the real tokens), latents, schedule (``sigma_min = 0``, resolution-dependent shift),
transformer and VAE. The denoising loop is written here with the recorder's four calls rather
than kept: vLLM-Omni 0.26's ``ZImagePipeline.forward`` holds its loop inline, encodes text only
(it applies the chat template itself, no prompt embeddings or token ids) and serves one request at
a time (``supports_request_batch = False``). The guided velocity is the training adapter's
:func:`~verl_omni.pipelines.z_image.training_adapter.guided_velocity`, the same code the replay runs
(Z-Image's g = w − 1, ``cfg_truncation``, ``cfg_normalization``).

The prompt ids are the chat-templated Qwen3 ids (``ZImageTrainingAdapter.prompt_token_ids``).
Recorded per sample: ``prompt_embeds`` ``[L, D]`` + ``prompt_embeds_mask`` ``[L]``, and with CFG the
negatives (the empty prompt unless one is sent); latents packed to ``[S, 4C]``.
"""

from __future__ import annotations

import torch
from vllm_omni.diffusion.models.z_image.pipeline_z_image import ZImagePipeline, calculate_shift, retrieve_timesteps

from verl_omni.pipelines.diffusers_rollout import DiffusersRolloutMixin
from verl_omni.pipelines.recorder import RolloutRecorder
from verl_omni.pipelines.rollout_request import RolloutRequest
from verl_omni.pipelines.schedulers.flow_match_sde import schedule_sigmas
from verl_omni.pipelines.z_image.training_adapter import (
    DEFAULT_CFG_NORMALIZATION,
    ZImageTrainingAdapter,
    cfg_scales,
    guided_velocity,
)
from verl_omni.utils.vllm_omni_compat import z_image_transformer_from_checkpoint


def _pad_rows(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Variable-length ``[L_i, D]`` rows as ``[B, L, D]`` (right-padded) and their ``[B, L]`` mask."""
    length = max(r.shape[0] for r in rows)
    embeds = torch.stack([torch.cat([r, r.new_zeros(length - r.shape[0], r.shape[1])]) for r in rows])
    mask = torch.stack([torch.arange(length, device=embeds.device) < r.shape[0] for r in rows]).long()
    return embeds, mask


class ZImageLogProbPipeline(DiffusersRolloutMixin, ZImagePipeline):
    """Z-Image rollout pipeline: token ids in; images, SDE trajectories and log-probs out."""

    supports_request_batch = True

    def __init__(self, *, od_config, prefix: str = ""):
        # vLLM-Omni 0.26 builds the released 6B transformer whatever the checkpoint's config says (version-gated)
        with z_image_transformer_from_checkpoint(od_config.model):
            super().__init__(od_config=od_config, prefix=prefix)

    def _captions(self, requests: list[RolloutRequest], negative: bool) -> list[torch.Tensor]:
        """Caption features ``[L_i, D]`` per request: the encoder's second-to-last states of the real tokens."""
        empty = ZImageTrainingAdapter.prompt_token_ids(self.tokenizer, "")
        rows = [(r.negative_prompt_token_ids or empty) if negative else r.prompt_token_ids for r in requests]
        ids = torch.full((len(rows), max(map(len, rows))), self.tokenizer.pad_token_id or 0, dtype=torch.long)
        mask = torch.zeros(ids.shape, dtype=torch.bool)
        for i, row in enumerate(rows):
            ids[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), True
        ids, mask = ids.to(self._execution_device), mask.to(self._execution_device)
        hidden = self.text_encoder(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[-2]
        return [hidden[i][mask[i]] for i in range(len(rows))]

    def conditioning(self, requests: list[RolloutRequest], negative: bool) -> dict[str, torch.Tensor]:
        embeds, mask = _pad_rows(self._captions(requests, negative))
        key = "negative_prompt_embeds" if negative else "prompt_embeds"
        return {key: self.per_sample(embeds, requests), f"{key}_mask": self.per_sample(mask, requests)}

    def rollout_forward(self, req):
        requests, spec, cond = self.conditioned_batch(req)
        captions = [
            e[m.bool()].to(self.od_config.dtype)
            for e, m in zip(cond["prompt_embeds"], cond["prompt_embeds_mask"], strict=True)
        ]
        negatives = []
        if spec.uses_cfg:
            negatives = [
                e[m.bool()].to(self.od_config.dtype)
                for e, m in zip(cond["negative_prompt_embeds"], cond["negative_prompt_embeds_mask"], strict=True)
            ]

        device = self._execution_device
        recorder = RolloutRecorder(requests, device)
        latents = self.prepare_latents(
            recorder.num_samples,
            self.transformer.in_channels,
            spec.height,
            spec.width,
            torch.float32,
            device,
            recorder.generators,
        )
        config = self.scheduler.config
        mu = calculate_shift(
            (latents.shape[2] // 2) * (latents.shape[3] // 2),
            config.get("base_image_seq_len", 256),
            config.get("max_image_seq_len", 4096),
            config.get("base_shift", 0.5),
            config.get("max_shift", 1.15),
        )
        self.scheduler.sigma_min = 0.0
        timesteps, _ = retrieve_timesteps(self.scheduler, spec.num_inference_steps, device, mu=mu)
        recorder.set_schedule(schedule_sigmas(self.scheduler, device), timesteps)
        normalization = float(spec.model_kwargs.get("cfg_normalization", DEFAULT_CFG_NORMALIZATION))
        for t in recorder.loop_timesteps:
            model_time = ((1000 - t) / 1000).expand(latents.shape[0]).float()
            scales = cfg_scales(spec, model_time[:1]) * latents.shape[0]
            velocity = guided_velocity(
                self.transformer,
                latents.to(self.od_config.dtype),
                model_time,
                captions,
                negatives,
                scales,
                normalization,
            )
            latents = recorder.step(velocity, latents)
        images = latents.to(self.vae.dtype) / self.vae.config.scaling_factor + self.vae.config.shift_factor
        images = self.vae.decode(images, return_dict=False)[0]
        return self.rollout_outputs(recorder, images, cond, packed=False)

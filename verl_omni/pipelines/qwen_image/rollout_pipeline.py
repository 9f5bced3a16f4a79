"""vLLM-Omni Qwen-Image pipeline that samples with the Flow-GRPO SDE step and records log-probs.

Plugged into vLLM-Omni through ``custom_pipeline_args`` (``pipeline_class`` =
``verl_omni.pipelines.qwen_image.rollout_pipeline.QwenImageLogProbPipeline``). It reuses the stock
pipeline for text encoding, latents, timesteps, CFG (incl. CFG-parallel) and VAE decoding, and
replaces the scheduler step (:meth:`step_scheduler`) with the shared SDE step. ``forward`` is
overridden only to take token ids, give every sample its own generator and SDE window, and
return the trajectory; all requests of an engine batch, each with N samples, share one
transformer batch.

Per request the output carries, batched over its N samples (see docs/design.md, "Data contracts", and
:mod:`verl_omni.pipelines.rollout_output` for how it travels): the images as uint8 pixels [N, 3, H, W] and a
trajectory with what the shared :class:`~verl_omni.pipelines.recorder.RolloutRecorder` recorded
(``all_latents`` [N, W+1, S, C] packed, ``rollout_log_probs`` [N, W], ``all_timesteps`` [N, W],
``window_start`` [N]) plus ``prompt_embeds`` [1, L, D], ``prompt_embeds_mask`` [1, L] and, with CFG,
``negative_prompt_embeds``/``negative_prompt_embeds_mask``: the request's conditioning once, shared by its N
samples (``engine.unpack_request_output`` repeats it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from vllm_omni.diffusion.data import DiffusionOutput
from vllm_omni.diffusion.models.qwen_image.pipeline_qwen_image import QwenImagePipeline
from vllm_omni.diffusion.models.qwen_image.rope_utils import txt_seq_lens_from_embeds

from verl_omni.pipelines.qwen_image.rollout_request import (
    QWEN_IMAGE_PROMPT_DROP_TOKENS,
    RolloutRequest,
    parse_rollout_request,
)
from verl_omni.pipelines.recorder import RolloutRecorder, shared_row
from verl_omni.pipelines.rollout_output import all_finite, request_output
from verl_omni.pipelines.sampling import SamplingSpec, shared_spec
from verl_omni.pipelines.schedulers.flow_match_sde import FlowMatchSDEDiscreteScheduler, schedule_sigmas

logger = logging.getLogger(__name__)

# images per VAE decode call: a transformer batch holds n x requests images (128 in a 512² recipe
# step), too many for one decode beside a colocated actor; one at a time is slower than the stock
# pipeline's one call per request
VAE_DECODE_CHUNK = 16


@dataclass
class Conditioning:
    """Per-sample text conditioning ``[B, L, D]`` / ``[B, L]``; negatives only with true CFG."""

    embeds: torch.Tensor
    mask: torch.Tensor
    negative_embeds: torch.Tensor | None = None
    negative_mask: torch.Tensor | None = None


@dataclass(frozen=True)
class BatchSettings:
    """What one transformer batch runs with: its requests in order, the spec they share, whether CFG runs."""

    requests: list[RolloutRequest]
    spec: SamplingSpec
    do_true_cfg: bool

    @property
    def height(self) -> int:
        return self.spec.height

    @property
    def width(self) -> int:
        return self.spec.width


class QwenImageLogProbPipeline(QwenImagePipeline):
    """Qwen-Image rollout pipeline: token ids in; images, SDE trajectories and log-probs out."""

    supports_request_batch = True
    # the trajectory recording lives in forward(); the engine's step-execution mode is not wired
    supports_step_execution = False

    def __init__(self, *, od_config, prefix: str = ""):
        super().__init__(od_config=od_config, prefix=prefix)
        self.scheduler = FlowMatchSDEDiscreteScheduler.from_config(self.scheduler.config)
        # requests per transformer batch, in order: read by the worker extension (batching metric)
        self.request_batch_sizes: list[int] = []

    # ---- text conditioning from token ids -------------------------------------------------

    @torch.no_grad()
    def encode_token_ids(self, ids: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Embeddings ``[B, L, D]`` and mask ``[B, L]`` of templated prompt ids (prefix dropped)."""
        too_short = [len(row) for row in ids if len(row) <= QWEN_IMAGE_PROMPT_DROP_TOKENS]
        if too_short:
            raise ValueError(
                f"prompt ids must be longer than the {QWEN_IMAGE_PROMPT_DROP_TOKENS}-token template prefix "
                f"(apply the Qwen-Image template first); got lengths {too_short}"
            )
        width = max(len(row) for row in ids)
        pad_id = self.tokenizer.pad_token_id or 0
        input_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(ids), width), dtype=torch.long)
        for i, row in enumerate(ids):
            input_ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
            mask[i, : len(row)] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        hidden = self.text_encoder(input_ids=input_ids, attention_mask=mask, output_hidden_states=True)
        rows = [h[QWEN_IMAGE_PROMPT_DROP_TOKENS:] for h in self._extract_masked_hidden(hidden.hidden_states[-1], mask)]
        length = max(r.shape[0] for r in rows)
        embeds = torch.stack([torch.cat([r, r.new_zeros(length - r.shape[0], r.shape[1])]) for r in rows])
        out_mask = torch.stack([torch.arange(length, device=embeds.device) < r.shape[0] for r in rows]).long()
        return embeds, out_mask

    def _per_sample_embeds(self, requests: list[RolloutRequest], negative: bool):
        ids = [r.negative_prompt_token_ids if negative else r.prompt_token_ids for r in requests]
        embeds, mask = self.encode_token_ids(ids)
        counts = torch.tensor([r.num_samples for r in requests], device=embeds.device)
        return embeds.repeat_interleave(counts, dim=0), mask.repeat_interleave(counts, dim=0)

    # ---- the SDE step ------------------------------------------------------------------------

    def step_scheduler(self, recorder: RolloutRecorder, noise_pred: torch.Tensor, latents: torch.Tensor, **kwargs: Any):
        """One SDE/ODE step of every sample through the shared recorder (records each sample's window)."""
        if self.interrupt:
            return latents
        return recorder.step(noise_pred, latents)

    # ---- the request batch -------------------------------------------------------------------

    def _batch_settings(self, req) -> BatchSettings:
        """Each request resolved per sample, and the settings the requests of one transformer batch share."""
        requests = [parse_rollout_request(p, sp) for p, sp in zip(req.prompts, req.sampling_params_list, strict=True)]
        spec = shared_spec([r.spec for r in requests])
        with_neg = {r.negative_prompt_token_ids is not None for r in requests}
        if len(with_neg) > 1:
            raise ValueError("requests batched together must all have, or all lack, negative_prompt_token_ids")
        return BatchSettings(requests=requests, spec=spec, do_true_cfg=with_neg.pop() and spec.uses_cfg)

    def forward(self, req) -> list[DiffusionOutput]:
        """Denoise all requests of ``req`` in one transformer batch and return one output per request."""
        if req.is_dummy_run():
            # the engine's start-up warm-up request carries text, not token ids: stock path
            return super().forward(req)
        self.request_batch_sizes.append(req.num_reqs)
        # 1. Shared and per-request (per-sample) settings.
        settings = self._batch_settings(req)
        requests = settings.requests
        self._interrupt = False
        self._attention_kwargs = {}

        # 2. Conditioning, per-sample latents and the schedule.
        cond = Conditioning(*self._per_sample_embeds(requests, negative=False))
        if settings.do_true_cfg:
            cond.negative_embeds, cond.negative_mask = self._per_sample_embeds(requests, negative=True)
        recorder = RolloutRecorder(requests, self.device)
        channels = self.transformer.in_channels // 4
        latents = self.prepare_latents(
            recorder.num_samples,
            channels,
            settings.height,
            settings.width,
            cond.embeds.dtype,
            self.device,
            recorder.generators,
        )
        timesteps, _ = self.prepare_timesteps(settings.spec.num_inference_steps, None, latents.shape[1])
        self._num_timesteps = len(timesteps)
        recorder.set_schedule(schedule_sigmas(self.scheduler, latents.device), timesteps)

        # 3. Denoise: stock CFG prediction, the recorder's step.
        latents = self._denoise(recorder, latents, recorder.loop_timesteps, cond, settings)
        self._current_timestep = None

        # 4. Decode and split per request (each request's pixels made on the device, rollout_output).
        images = self._decode_latents(latents, settings.height, settings.width, "pt").output
        if not all_finite(images):
            raise FloatingPointError(f"decoded images of requests {req.request_ids} have non-finite pixels")
        return self._split_outputs(recorder, images, cond)

    def _decode_latents(self, latents: torch.Tensor, height: int, width: int, output_type: str = "pil"):
        """The stock decode, :data:`VAE_DECODE_CHUNK` images per VAE call."""
        chunks = []
        for chunk in latents.split(VAE_DECODE_CHUNK):  # a loop: zero-argument super() fails in a 3.11 comprehension
            chunks.append(super()._decode_latents(chunk, height, width, output_type))
        return DiffusionOutput(output=torch.cat([c.output for c in chunks]), stage_durations=chunks[0].stage_durations)

    def _denoise(self, recorder, latents, timesteps, cond: Conditioning, settings: BatchSettings) -> torch.Tensor:
        batch = latents.shape[0]
        side = self.vae_scale_factor * 2
        img_shapes = [[(1, settings.height // side, settings.width // side)]] * batch
        self.transformer.do_true_cfg = settings.do_true_cfg
        for t in timesteps:
            self._current_timestep = t
            positive, negative, output_slice = self._build_denoise_kwargs(
                latents=latents,
                timestep=t,
                guidance=None,
                prompt_embeds=cond.embeds,
                prompt_embeds_mask=cond.mask,
                img_shapes=img_shapes,
                txt_seq_lens=txt_seq_lens_from_embeds(cond.embeds),
                do_true_cfg=settings.do_true_cfg,
                negative_prompt_embeds=cond.negative_embeds,
                negative_prompt_embeds_mask=cond.negative_mask,
                negative_txt_seq_lens=txt_seq_lens_from_embeds(cond.negative_embeds),
                extra_transformer_kwargs={"attention_kwargs": self.attention_kwargs, "return_dict": False},
            )
            noise_pred = self.predict_noise_maybe_with_cfg(
                settings.do_true_cfg,
                settings.spec.true_cfg_scale,
                positive,
                negative,
                cfg_normalize=True,
                output_slice=output_slice,
            )
            latents = self.step_scheduler(recorder, noise_pred, latents)
        return latents

    @staticmethod
    def _trim(embeds: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Drop the padding columns a request only has because of its batch companions."""
        length = int(mask.sum(dim=1).max())
        return embeds[:, :length].detach(), mask[:, :length].detach()

    def _split_outputs(self, recorder: RolloutRecorder, images: torch.Tensor, cond: Conditioning):
        outputs = []
        for rows, recorded in zip(recorder.rows(), recorder.split_on_device(), strict=True):
            first = shared_row(rows)
            embeds, mask = self._trim(cond.embeds[first], cond.mask[first])
            trajectory = {
                **recorded,
                "prompt_embeds": embeds,
                "prompt_embeds_mask": mask,
            }
            if cond.negative_embeds is not None:
                n_embeds, n_mask = self._trim(cond.negative_embeds[first], cond.negative_mask[first])
                trajectory["negative_prompt_embeds"] = n_embeds
                trajectory["negative_prompt_embeds_mask"] = n_mask
            outputs.append(request_output(images[rows.start : rows.stop], trajectory))
        return outputs

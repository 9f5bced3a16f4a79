"""vLLM-Omni Qwen-Image-Edit pipeline that samples with the Flow-GRPO SDE step and records log-probs.

Named by ``QwenImageEditTrainingAdapter.rollout_pipeline``; vLLM-Omni loads it as the custom pipeline
of a ``QwenImageEditPipeline`` checkpoint. It keeps vLLM-Omni's VAE encoding of the source image,
packed latents, schedule and denoising loop (``diffuse``: the source image's latent tokens appended
to the noise tokens, true CFG with the norm rescale), run inside ``recorder.recording(self)`` so each
scheduler step is the recorder's. ``forward`` is overridden to take token ids and the request's
source image, give every sample its own seed, and return images and trajectories
(:mod:`verl_omni.pipelines.diffusers_rollout`).

Per request the source image is resized to ``model_kwargs.condition_area`` pixels (default the stock
1024²) at its aspect ratio, then encoded once for its N samples: by the VAE (``image_latents``) and,
with the templated instruction, by the Qwen2.5-VL text encoder (``prompt_embeds``; with CFG the
negative prompt with the same image). Recorded per request, beside the trajectory: ``prompt_embeds``
``[L, D]``, ``prompt_embeds_mask`` ``[L]``, ``image_latents`` ``[S_c, 4C]``, ``image_latents_grid``
``[2]`` (packed rows, columns: the RoPE shape of those tokens) and, with CFG, the negative embeddings.
Requests whose source images condition at different sizes are denoised as separate transformer batches.
"""

from __future__ import annotations

import torch
from vllm_omni.diffusion.data import DiffusionOutput
from vllm_omni.diffusion.models.qwen_image.pipeline_qwen_image_edit import QwenImageEditPipeline

from verl_omni.pipelines.diffusers_rollout import DiffusersRolloutMixin
from verl_omni.pipelines.qwen_image_edit.rollout_request import (
    DEFAULT_CONDITION_AREA,
    IMAGE_PAD_TOKEN,
    QWEN_IMAGE_EDIT_PROMPT_DROP_TOKENS,
    condition_size,
    expand_image_pads,
    source_image,
)
from verl_omni.pipelines.recorder import RolloutRecorder
from verl_omni.pipelines.rollout_request import RolloutRequest
from verl_omni.pipelines.sampling import SamplingSpec
from verl_omni.pipelines.schedulers.flow_match_sde import schedule_sigmas


class QwenImageEditLogProbPipeline(DiffusersRolloutMixin, QwenImageEditPipeline):
    """Qwen-Image-Edit rollout pipeline: token ids and a source image in; images, SDE trajectories, log-probs out."""

    @torch.no_grad()
    def forward(self, req) -> list[DiffusionOutput]:
        if req.is_dummy_run():
            # the engine's start-up warm-up request carries text, not token ids: stock path
            return super().forward(req)
        requests, spec = self.start_batch(req)
        area = float(spec.model_kwargs.get("condition_area", DEFAULT_CONDITION_AREA))
        sources = [source_image(p, rid) for p, rid in zip(req.prompts, req.request_ids, strict=True)]
        sizes = [condition_size(*image.size, area) for image in sources]
        # requests conditioned at one size share a transformer batch (their image tokens line up)
        outputs: list[DiffusionOutput | None] = [None] * len(requests)
        for size in dict.fromkeys(sizes):
            group = [j for j, s in enumerate(sizes) if s == size]
            images = [self.image_processor.resize(sources[j], size[1], size[0]) for j in group]
            done = self._denoise_group([requests[j] for j in group], images, spec)
            for j, output in zip(group, done, strict=True):
                outputs[j] = output
        return outputs

    def _vl_embeds(self, requests: list[RolloutRequest], images: list, negative: bool):
        """Qwen2.5-VL hidden states ``[R, L, D]`` and mask ``[R, L]`` of each request's ids with its image."""
        vision = self.processor.image_processor(images=images, return_tensors="pt")
        grid = vision["image_grid_thw"]
        merge = self.processor.image_processor.merge_size
        pad_id = self.tokenizer.convert_tokens_to_ids(IMAGE_PAD_TOKEN)
        ids = [
            expand_image_pads(r.negative_prompt_token_ids if negative else r.prompt_token_ids, pad_id, count)
            for r, count in zip(requests, (grid.prod(dim=1) // merge**2).tolist(), strict=True)
        ]
        width = max(len(row) for row in ids)
        input_ids = torch.full((len(ids), width), self.tokenizer.pad_token_id or 0, dtype=torch.long)
        mask = torch.zeros((len(ids), width), dtype=torch.long)
        for i, row in enumerate(ids):
            input_ids[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), 1
        hidden = self.text_encoder(
            input_ids=input_ids.to(self.device),
            attention_mask=mask.to(self.device),
            pixel_values=vision["pixel_values"].to(self.device, self.text_encoder.dtype),
            image_grid_thw=grid.to(self.device),
            output_hidden_states=True,
        ).hidden_states[-1]
        rows = [
            h[QWEN_IMAGE_EDIT_PROMPT_DROP_TOKENS:] for h in self._extract_masked_hidden(hidden, mask.to(hidden.device))
        ]
        length = max(r.shape[0] for r in rows)
        embeds = torch.stack([torch.cat([r, r.new_zeros(length - r.shape[0], r.shape[1])]) for r in rows])
        out_mask = torch.stack([torch.arange(length, device=embeds.device) < r.shape[0] for r in rows]).long()
        return embeds, out_mask

    def _denoise_group(self, requests: list[RolloutRequest], images: list, spec: SamplingSpec) -> list[DiffusionOutput]:
        # 1. Conditioning of each request (once for its samples): VL embeddings and the source image's latents.
        do_cfg = spec.uses_cfg and requests[0].negative_prompt_token_ids is not None
        if spec.uses_cfg and not do_cfg:
            raise ValueError(f"true_cfg_scale={spec.true_cfg_scale} needs negative_prompt_token_ids in the request")
        embeds, mask = self._vl_embeds(requests, images, negative=False)
        cond = {"prompt_embeds": embeds, "prompt_embeds_mask": mask}
        if do_cfg:
            cond["negative_prompt_embeds"], cond["negative_prompt_embeds_mask"] = self._vl_embeds(
                requests, images, negative=True
            )
        pixels = self.image_processor.preprocess(images, images[0].height, images[0].width).unsqueeze(2)
        image_latents = self._encode_vae_image(pixels.to(self.device, self.vae.dtype), None)
        rows, cols = image_latents.shape[3] // 2, image_latents.shape[4] // 2
        channels = self.transformer.in_channels // 4
        cond["image_latents"] = self._pack_latents(image_latents, len(requests), channels, 2 * rows, 2 * cols)
        cond["image_latents_grid"] = torch.tensor([[rows, cols]] * len(requests), device=self.device)
        cond = {k: self.per_sample(v, requests) for k, v in cond.items()}

        # 2. Per-sample noise and the schedule.
        recorder = RolloutRecorder(requests, self.device)
        latents, _ = self.prepare_latents(
            None,
            recorder.num_samples,
            channels,
            spec.height,
            spec.width,
            embeds.dtype,
            self.device,
            recorder.generators,
        )
        timesteps, _ = self.prepare_timesteps(spec.num_inference_steps, None, latents.shape[1])
        self._num_timesteps, self._attention_kwargs = len(timesteps), {}
        self._current_timestep, self._interrupt = None, False
        recorder.set_schedule(schedule_sigmas(self.scheduler, latents.device), timesteps)
        side = 2 * self.vae_scale_factor
        img_shapes = [[(1, spec.height // side, spec.width // side), (1, rows, cols)]] * latents.shape[0]

        # 3. Denoise: the stock loop (image tokens appended, true CFG), the recorder's step.
        negative = (cond.get("negative_prompt_embeds"), cond.get("negative_prompt_embeds_mask"))
        with recorder.recording(self):
            latents = self.diffuse(
                cond["prompt_embeds"],
                cond["prompt_embeds_mask"],
                *negative,
                latents,
                img_shapes,
                cond["prompt_embeds_mask"].sum(dim=1).tolist(),
                None if negative[1] is None else negative[1].sum(dim=1).tolist(),
                recorder.loop_timesteps,
                do_cfg,
                None,
                spec.true_cfg_scale,
                image_latents=cond["image_latents"],
                cfg_normalize=True,
                additional_transformer_kwargs={"return_dict": False, "attention_kwargs": {}},
            )
        self._current_timestep = None

        # 4. Decode (the stock un-normalisation) and split per request.
        latents = self._unpack_latents(latents, spec.height, spec.width, self.vae_scale_factor).to(self.vae.dtype)
        z = self.vae.config.z_dim
        mean = torch.tensor(self.vae.config.latents_mean).view(1, z, 1, 1, 1).to(latents)
        std = torch.tensor(self.vae.config.latents_std).view(1, z, 1, 1, 1).to(latents)
        decoded = self.vae.decode(latents * std + mean, return_dict=False)[0][:, :, 0]
        return self.rollout_outputs(recorder, decoded, cond, packed=True)

"""vLLM-Omni Qwen-Image-Edit pipelines that sample with the Flow-GRPO SDE step and record log-probs.

Named by the edit adapters' ``rollout_pipeline``; vLLM-Omni loads them as the custom pipeline of a
``QwenImageEditPipeline`` (one source image) or ``QwenImageEditPlusPipeline`` (1 to 4) checkpoint. They
keep vLLM-Omni's VAE encoding of the source images, packed latents, schedule and denoising loop
(``diffuse``: the source images' latent tokens appended to the noise tokens, true CFG with the norm
rescale), run inside ``recorder.recording(self)`` so each scheduler step is the recorder's.
``forward`` is overridden to take token ids and the request's source images, give every sample its
own seed, and return images and trajectories (:mod:`verl_omni.pipelines.diffusers_rollout`).

Per request each source image is resized to ``model_kwargs.condition_area`` pixels (default the stock
1024²) at its aspect ratio and encoded once for its N samples by the VAE; the vision tower reads the
same image (Qwen-Image-Edit) or one resized to ``model_kwargs.vl_condition_area`` (Plus: default the
stock 384²), with the templated instruction (``prompt_embeds``; with CFG the negative prompt with the
same images). Recorded per request, beside the trajectory: ``prompt_embeds`` ``[L, D]``,
``prompt_embeds_mask`` ``[L]``, ``image_latents`` ``[S_c, 4C]`` (the images' tokens one after the other),
``image_latents_grid`` ``[K, 2]`` (each image's packed rows, columns: the RoPE shapes of those tokens)
and, with CFG, the negative embeddings. Requests whose images condition at different sizes are denoised
as separate transformer batches.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from vllm_omni.diffusion.data import DiffusionOutput
from vllm_omni.diffusion.models.qwen_image.pipeline_qwen_image_edit import QwenImageEditPipeline

from verl_omni.pipelines.diffusers_rollout import EditRolloutMixin
from verl_omni.pipelines.qwen_image_edit.rollout_request import (
    CONDITION_SIDE_MULTIPLE,
    DEFAULT_CONDITION_AREA,
    IMAGE_PAD_TOKEN,
    QWEN_IMAGE_EDIT_PROMPT_DROP_TOKENS,
    expand_image_pads,
)
from verl_omni.pipelines.recorder import RolloutRecorder
from verl_omni.pipelines.rollout_request import RolloutRequest, condition_size
from verl_omni.pipelines.sampling import SamplingSpec


class QwenImageEditRolloutMixin(EditRolloutMixin):
    """Put before a vLLM-Omni Qwen-Image edit pipeline class (the module docstring); variants set the class facts."""

    #: pixels of a source image as the vision tower sees it; None: the VAE's (``condition_area``)
    default_vl_condition_area: ClassVar[float | None] = None

    def image_prompt_ids(self, ids: list[int], count: int) -> list[int]:
        """The request's ids with one image block per source image (one image: the ids as built)."""
        return ids

    def condition_size(self, image, spec: SamplingSpec) -> tuple[int, int]:
        """``model_kwargs.condition_area`` pixels (default the stock 1024²) at the image's aspect ratio."""
        area = float(spec.model_kwargs.get("condition_area", DEFAULT_CONDITION_AREA))
        return condition_size(*image.size, area, CONDITION_SIDE_MULTIPLE)

    def denoise_edits(
        self, requests: list[RolloutRequest], sources: list[list], sizes: tuple, spec: SamplingSpec
    ) -> list[DiffusionOutput]:
        vl_area = spec.model_kwargs.get("vl_condition_area", self.default_vl_condition_area)
        vae_images = [self.resized(images, sizes) for images in sources]
        vl_images = vae_images
        if vl_area is not None:
            vl_images = [
                self.resized(
                    images, [condition_size(*im.size, float(vl_area), CONDITION_SIDE_MULTIPLE) for im in images]
                )
                for images in sources
            ]
        return self._denoise_group(requests, vae_images, vl_images, spec)

    def _vl_embeds(self, requests: list[RolloutRequest], images: list[list], negative: bool):
        """Qwen2.5-VL hidden states ``[R, L, D]`` and mask ``[R, L]`` of each request's ids with its images."""
        flat = [im for request_images in images for im in request_images]
        vision = self.processor.image_processor(images=flat, return_tensors="pt")
        grid = vision["image_grid_thw"]
        counts = (grid.prod(dim=1) // self.processor.image_processor.merge_size**2).tolist()
        pad_id = self.tokenizer.convert_tokens_to_ids(IMAGE_PAD_TOKEN)
        ids, start = [], 0
        for r, request_images in zip(requests, images, strict=True):
            base = self.image_prompt_ids(
                r.negative_prompt_token_ids if negative else r.prompt_token_ids, len(request_images)
            )
            ids.append(expand_image_pads(base, pad_id, counts[start : start + len(request_images)]))
            start += len(request_images)
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

    def _image_latents(self, images: list[list]) -> tuple[torch.Tensor, torch.Tensor]:
        """Packed VAE latents ``[R, S_c, 4C]`` of each request's images one after the other, and their grids
        ``[R, K, 2]`` (the k-th images of the requests have one size: they are encoded together)."""
        channels = self.transformer.in_channels // 4
        tokens, grids = [], []
        for k in range(len(images[0])):
            column = [request_images[k] for request_images in images]
            pixels = self.image_processor.preprocess(column, column[0].height, column[0].width).unsqueeze(2)
            latents = self._encode_vae_image(pixels.to(self.device, self.vae.dtype), None)
            rows, cols = latents.shape[3] // 2, latents.shape[4] // 2
            tokens.append(self._pack_latents(latents, len(column), channels, 2 * rows, 2 * cols))
            grids.append((rows, cols))
        grid = torch.tensor([grids] * len(images), device=self.device)
        return torch.cat(tokens, dim=1), grid

    def _denoise_group(
        self, requests: list[RolloutRequest], vae_images: list[list], vl_images: list[list], spec: SamplingSpec
    ) -> list[DiffusionOutput]:
        # 1. Conditioning of each request (once for its samples): VL embeddings and the source images' latents.
        do_cfg = spec.uses_cfg and requests[0].negative_prompt_token_ids is not None
        if spec.uses_cfg and not do_cfg:
            raise ValueError(f"true_cfg_scale={spec.true_cfg_scale} needs negative_prompt_token_ids in the request")
        embeds, mask = self._vl_embeds(requests, vl_images, negative=False)
        cond = {"prompt_embeds": embeds, "prompt_embeds_mask": mask}
        if do_cfg:
            cond["negative_prompt_embeds"], cond["negative_prompt_embeds_mask"] = self._vl_embeds(
                requests, vl_images, negative=True
            )
        cond["image_latents"], cond["image_latents_grid"] = self._image_latents(vae_images)
        cond = {k: self.per_sample(v, requests) for k, v in cond.items()}

        # 2. Per-sample noise and the schedule.
        recorder = RolloutRecorder(requests, self.device)
        channels = self.transformer.in_channels // 4
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
        self.start_schedule(recorder, spec, latents.shape[1], latents.device)
        self._attention_kwargs = {}
        side = 2 * self.vae_scale_factor
        shapes = [(1, spec.height // side, spec.width // side)]
        shapes += [(1, int(r), int(c)) for r, c in cond["image_latents_grid"][0].tolist()]
        img_shapes = [shapes] * latents.shape[0]

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


class QwenImageEditLogProbPipeline(QwenImageEditRolloutMixin, QwenImageEditPipeline):
    """Qwen-Image-Edit rollout pipeline: token ids and one source image in; images, SDE trajectories, log-probs out."""

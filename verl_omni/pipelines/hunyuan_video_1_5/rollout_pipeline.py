"""vLLM-Omni HunyuanVideo-1.5 pipelines (text to video, image to video) that sample with the Flow-GRPO SDE step and
record log-probs.

Named by the adapters' ``rollout_pipeline``; vLLM-Omni loads them as the custom pipelines of ``HunyuanVideo15Pipeline``
/ ``HunyuanVideo15ImageToVideoPipeline`` checkpoints. They keep vLLM-Omni's text encoders (``_get_mllm_prompt_embeds``:
the chat template, the hidden states 3 from the end, the first 108 template tokens cropped;
``_get_byte5_prompt_embeds``: ByT5 on the prompt's quoted glyph text), latents, first-frame condition
(``prepare_cond_latents_and_mask``), SigLIP image states, transformer, CFG (``predict_noise_maybe_with_cfg``), schedule
and VAE. The denoising loop is written here with the recorder's calls rather than kept: vLLM-Omni's ``forward`` holds
it inline and serves one prompt per request. Each step is the stock step's: the transformer on
``cat([latents, condition, mask])`` at ``t``, the negative pass on the negative prompt's streams with the same
condition and image states.

The prompt ids are the Qwen2.5-VL ids of the prompt itself (``HunyuanVideo15TrainingAdapter.prompt_token_ids``),
decoded here to the text both encoders read. What is recorded: the adapters' ``conditioning_keys`` (module docstring of
:mod:`verl_omni.pipelines.hunyuan_video_1_5.training_adapter`). The videos leave as final uint8 pixels
``[N, 3, F, H, W]`` (``pipelines/rollout_output.py``); ``engine.unpack_request_output`` gives each sample uint8
``[F, 3, H, W]``.
"""

from __future__ import annotations

import numpy as np
import torch
from vllm_omni.diffusion.data import DiffusionOutput
from vllm_omni.diffusion.models.hunyuan_video.pipeline_hunyuan_video_1_5 import HunyuanVideo15Pipeline
from vllm_omni.diffusion.models.hunyuan_video.pipeline_hunyuan_video_1_5_i2v import HunyuanVideo15I2VPipeline

from verl_omni.pipelines.diffusers_rollout import DiffusersRolloutMixin, EditRolloutMixin
from verl_omni.pipelines.model_base import get_model_adapter
from verl_omni.pipelines.recorder import RolloutRecorder
from verl_omni.pipelines.rollout_request import RolloutRequest
from verl_omni.pipelines.sampling import SamplingSpec
from verl_omni.pipelines.schedulers.flow_match_sde import schedule_sigmas

# videos per VAE decode call: one, as the stock forward decodes (diffusers 0.38's VAE mid-block attention builds its
# causal mask [B, L, L] against queries [B, 1, L, C], which broadcasts only for B = 1)
VAE_DECODE_CHUNK = 1


class HunyuanVideo15Rollout:
    """What both rollout pipelines add to vLLM-Omni's: the recorded prompt streams, the loop under the recorder and
    the decode. Put first in the bases."""

    def __init__(self, *, od_config, prefix: str = ""):
        super().__init__(od_config=od_config, prefix=prefix)
        # refuses a step-distilled (MeanFlow) checkpoint, whose steps read a second timestep
        self.adapter = get_model_adapter(od_config.model)

    @property
    def model_dtype(self) -> torch.dtype:
        """The transformer's dtype, read as the stock forward reads it."""
        return self.transformer.transformer_blocks[0].norm1.linear.weight.dtype

    def conditioning(self, requests: list[RolloutRequest], negative: bool) -> dict[str, torch.Tensor]:
        """Both prompt streams of each request's text (the empty prompt for a missing negative), per sample: the
        Qwen2.5-VL states ``[N, 1000, D]`` and ByT5 glyph states ``[N, 256, D2]``, with their ``[N, L]`` masks."""
        texts = self.prompt_texts(self.tokenizer, requests, negative=negative)
        dtype = self.model_dtype
        embeds, mask = self._get_mllm_prompt_embeds(texts, self.device, dtype)
        embeds_2, mask_2 = self._get_byte5_prompt_embeds(texts, self.device, dtype)
        prefix = "negative_" if negative else ""
        cond = {
            f"{prefix}prompt_embeds": embeds.float(),
            f"{prefix}prompt_embeds_mask": mask.long(),
            f"{prefix}prompt_embeds_2": embeds_2.float(),
            f"{prefix}prompt_embeds_2_mask": mask_2.long(),
        }
        return {k: self.per_sample(v, requests) for k, v in cond.items()}

    def _streams(self, cond: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
        """The transformer's prompt-stream arguments, as the stock forward passes them (masks in the model's dtype)."""
        dtype = self.model_dtype
        return {
            "encoder_hidden_states": cond[f"{prefix}prompt_embeds"].to(dtype),
            "encoder_attention_mask": cond[f"{prefix}prompt_embeds_mask"].to(dtype),
            "encoder_hidden_states_2": cond[f"{prefix}prompt_embeds_2"].to(dtype),
            "encoder_attention_mask_2": cond[f"{prefix}prompt_embeds_2_mask"].to(dtype),
        }

    def denoise(
        self,
        requests: list[RolloutRequest],
        spec: SamplingSpec,
        cond: dict[str, torch.Tensor],
        condition: torch.Tensor | None,
        image_embeds: torch.Tensor,
    ) -> list[DiffusionOutput]:
        """Sample the batch under the recorder and decode it. ``condition``: per-sample ``[N, C + 1, F', h, w]``
        (None: text to video's zeros); ``image_embeds``: per-sample ``[N, T, D_img]``."""
        dtype, device = self.model_dtype, self.device
        recorder = RolloutRecorder(requests, device)
        latents = self.prepare_latents(
            recorder.num_samples, spec.height, spec.width, spec.num_frames, torch.float32, device, recorder.generators
        )
        if condition is None:
            condition = torch.cat(self.prepare_cond_latents_and_mask(latents, dtype, device), dim=1)
        condition, image_embeds = condition.to(dtype), image_embeds.to(dtype)
        self.scheduler.set_timesteps(sigmas=np.linspace(1.0, 0.0, spec.num_inference_steps + 1)[:-1], device=device)
        timesteps = self.scheduler.timesteps
        recorder.set_schedule(schedule_sigmas(self.scheduler, device), timesteps)
        self._num_timesteps, self._guidance_scale = len(timesteps), spec.true_cfg_scale
        positive, negative = self._streams(cond, ""), self._streams(cond, "negative_") if spec.uses_cfg else None
        for t in recorder.loop_timesteps:
            self._current_timestep = t
            hidden = torch.cat([latents.to(dtype), condition], dim=1)
            shared = {
                "hidden_states": hidden,
                "timestep": t.expand(hidden.shape[0]).to(dtype),
                "timestep_r": None,
                "image_embeds": image_embeds,
                "return_dict": False,
            }
            velocity = self.predict_noise_maybe_with_cfg(
                do_true_cfg=spec.uses_cfg,
                true_cfg_scale=spec.true_cfg_scale,
                positive_kwargs=shared | positive,
                negative_kwargs=shared | negative if spec.uses_cfg else None,
                cfg_normalize=False,
            )
            latents = recorder.step(velocity, latents)
        self._current_timestep = None
        scaled = latents.to(self.vae.dtype) / self.vae.config.scaling_factor
        videos = torch.cat([self.vae.decode(chunk, return_dict=False)[0] for chunk in scaled.split(VAE_DECODE_CHUNK)])
        return self.rollout_outputs(recorder, videos, cond, packed=True)


class HunyuanVideo15LogProbPipeline(HunyuanVideo15Rollout, DiffusersRolloutMixin, HunyuanVideo15Pipeline):
    """HunyuanVideo-1.5 text-to-video rollout pipeline: token ids in; videos, SDE trajectories and log-probs out."""

    def rollout_forward(self, req):
        requests, spec, cond = self.conditioned_batch(req)
        # the stock text-to-video image stream: zeros of the released width, which the transformer masks out
        zeros = torch.zeros(1, self.vision_num_semantic_tokens, self.vision_states_dim, device=self.device)
        return self.denoise(requests, spec, cond, None, zeros.expand(sum(r.num_samples for r in requests), -1, -1))


class HunyuanVideo15I2VLogProbPipeline(HunyuanVideo15Rollout, EditRolloutMixin, HunyuanVideo15I2VPipeline):
    """HunyuanVideo-1.5 image-to-video rollout pipeline: token ids and one source image in; videos, SDE trajectories
    and log-probs out. The source image arrives in the request's multimodal input
    (:class:`~verl_omni.pipelines.diffusers_rollout.EditRolloutMixin`); its condition and SigLIP states are computed
    once for the request's N samples and recorded as ``image_condition`` and ``image_embeds``."""

    def condition_size(self, image, spec: SamplingSpec) -> tuple[int, int]:
        """The video's size: the first frame is the source image resized to it."""
        return spec.width, spec.height

    def _image_condition(self, image, spec: SamplingSpec) -> torch.Tensor:
        """``[1, C + 1, F', h, w]``: the image's latents on the first latent frame (zeros after), then the mask that
        is 1 on that frame (vLLM-Omni's ``prepare_cond_latents_and_mask``, which reads only the latents' shape)."""
        frames = (spec.num_frames - 1) // self.vae_scale_factor_temporal + 1
        grid = (spec.height // self.vae_scale_factor_spatial, spec.width // self.vae_scale_factor_spatial)
        shape = torch.empty(1, self.num_channels_latents, frames, *grid, device=self.device)
        parts = self.prepare_cond_latents_and_mask(shape, image, spec.height, spec.width, torch.float32, self.device)
        return torch.cat(parts, dim=1)

    def denoise_edits(
        self, requests: list[RolloutRequest], sources: list[list], sizes: tuple, spec: SamplingSpec
    ) -> list[DiffusionOutput]:
        cond = self.prompt_conditioning(requests, spec)
        images = [images[0].convert("RGB") for images in sources]
        conditions = torch.cat([self._image_condition(image, spec) for image in images])
        embeds = torch.cat([self._get_image_embeds(image, self.device).float() for image in images])
        cond["image_condition"] = self.per_sample(conditions, requests)
        cond["image_embeds"] = self.per_sample(embeds, requests)
        return self.denoise(requests, spec, cond, cond["image_condition"], cond["image_embeds"])

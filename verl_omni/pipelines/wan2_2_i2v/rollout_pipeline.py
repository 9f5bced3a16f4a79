"""vLLM-Omni Wan2.2 I2V-A14B pipeline that samples with the Flow-GRPO SDE step and records log-probs.

Named by ``Wan22I2VA14BTrainingAdapter.rollout_pipeline``; vLLM-Omni loads it as the custom pipeline of a
``WanImageToVideoPipeline`` checkpoint. It keeps vLLM-Omni's transformers, VAE, first-frame condition
(``prepare_latents``: the source image then black frames through the VAE, normalised, behind the 4-channel
first-frame mask) and denoising loop (``diffuse``: ``cat([latents, condition])`` into the expert of the step's
timestep, classic CFG, each step through ``self.scheduler.step``), run inside ``recorder.recording(self)`` on
vLLM-Omni's Euler scheduler with the checkpoint's flow shift, as the text-to-video rollout
(:mod:`verl_omni.pipelines.wan2_2.rollout_pipeline`, whose prompt encoding, model-fact check and decode it shares).

The source image arrives in the request's multimodal input (:class:`~verl_omni.pipelines.diffusers_rollout.EditRolloutMixin`),
one per request, and is resized to the video's size as diffusers' and vLLM-Omni's pipelines resize it (PIL Lanczos,
pixels in [-1, 1]); its condition is encoded once for the request's N samples. Recorded per request, beside the
T2V keys (``prompt_embeds`` + mask, with CFG the negatives): ``image_condition`` ``[4 + C, F', h, w]``.
"""

from __future__ import annotations

import torch
from diffusers.utils.torch_utils import randn_tensor
from diffusers.video_processor import VideoProcessor
from vllm_omni.diffusion.data import DiffusionOutput
from vllm_omni.diffusion.models.wan2_2.pipeline_wan2_2 import build_wan_scheduler
from vllm_omni.diffusion.models.wan2_2.pipeline_wan2_2_i2v import Wan22I2VPipeline

from verl_omni.pipelines.diffusers_rollout import EditRolloutMixin
from verl_omni.pipelines.model_base import get_model_adapter
from verl_omni.pipelines.recorder import RolloutRecorder
from verl_omni.pipelines.rollout_request import RolloutRequest
from verl_omni.pipelines.sampling import SamplingSpec
from verl_omni.pipelines.wan2_2.rollout_pipeline import Wan22LogProbPipeline, denoise_and_decode
from verl_omni.pipelines.wan2_2.training_adapter import flow_shift


class Wan22I2VLogProbPipeline(EditRolloutMixin, Wan22I2VPipeline):
    """Wan2.2 I2V-A14B rollout pipeline: token ids and one source image in; videos, SDE trajectories, log-probs out."""

    # the text-to-video rollout's: UMT5 embeddings of the ids, the checkpoint's facts against the adapter's, the
    # expert boundary, the VAE's own latent scale
    conditioning = Wan22LogProbPipeline.conditioning
    _check_model_facts = Wan22LogProbPipeline._check_model_facts
    _boundary_ratio = Wan22LogProbPipeline._boundary_ratio
    _boundary_timestep = Wan22LogProbPipeline._boundary_timestep
    _denormalize = Wan22LogProbPipeline._denormalize

    def __init__(self, *, od_config, prefix: str = ""):
        super().__init__(od_config=od_config, prefix=prefix)
        # what the shared text-to-video methods read
        self.transformer_config = self.transformer.config
        self.adapter = get_model_adapter(od_config.model)
        self._check_model_facts()
        # vLLM-Omni's single-step Euler scheduler (the stock default, UniPC, is a multistep solver)
        self.scheduler = build_wan_scheduler("euler", flow_shift(od_config.model))
        self._sample_solver, self._flow_shift = "euler", self.scheduler._shift
        # the stock forward builds its resizer per call; diffusers' pipeline keeps one
        self.video_processor = VideoProcessor(vae_scale_factor=self.vae_scale_factor_spatial)

    def condition_size(self, image, spec: SamplingSpec) -> tuple[int, int]:
        """The video's size: the first frame is the source image resized to it."""
        return spec.width, spec.height

    def image_condition(self, image, spec: SamplingSpec) -> torch.Tensor:
        """``[1, 4 + C, F', h, w]``: the first-frame mask and the latent condition of ``image`` (vLLM-Omni's
        ``prepare_latents``; the noise it would draw is the recorder's, so a placeholder stands in for it)."""
        pixels = self.video_processor.preprocess(image, height=spec.height, width=spec.width)
        _, condition, _ = self.prepare_latents(
            image=pixels.to(self.device, torch.float32),
            batch_size=1,
            num_channels_latents=self.transformer_config.out_channels,
            height=spec.height,
            width=spec.width,
            num_frames=spec.num_frames,
            dtype=torch.float32,
            device=self.device,
            generator=None,
            latents=torch.empty(0),
        )
        return condition

    def denoise_edits(
        self, requests: list[RolloutRequest], sources: list[list], sizes: tuple, spec: SamplingSpec
    ) -> list[DiffusionOutput]:
        # 1. Conditioning of each request (once for its samples): the prompt(s) and the source image's condition.
        cond = self.prompt_conditioning(requests, spec)
        conditions = torch.cat([self.image_condition(images[0], spec) for images in sources])
        cond["image_condition"] = self.per_sample(conditions, requests)
        # 2. Per-sample noise (vLLM-Omni's draw, one generator per sample).
        recorder = RolloutRecorder(requests, self.device)
        shape = (recorder.num_samples, self.transformer_config.out_channels, *conditions.shape[2:])
        latents = randn_tensor(shape, generator=recorder.generators, device=self.device, dtype=torch.float32)

        # 3. The T2V rollout's schedule, loop and decode; the stock I2V loop concatenates the condition on channels
        # and picks the expert per step.
        return denoise_and_decode(
            self,
            recorder,
            latents,
            spec,
            cond,
            image_embeds=None,
            condition=cond["image_condition"],
            first_frame_mask=None,
        )

"""What the rollout pipelines of the diffusers-family models (SD3.5, FLUX.1, Z-Image) share.

Each model's pipeline subclasses vLLM-Omni 0.26's own and keeps its denoising loop; this mixin
adds what a log-prob rollout needs around that loop: the requests of one transformer batch parsed
(token ids, one :class:`~verl_omni.pipelines.sampling.SamplingSpec` each, shared shape and
guidance), the prompt text for models with several tokenizers, per-sample conditioning, and the
per-request outputs.

Output per request (:func:`~verl_omni.pipelines.rollout_output.request_output`): its images as uint8 pixels
made on the device and its trajectory, the tensors the engine carries through shared memory left on the device:
what the recorder recorded (``all_latents`` packed to ``[N, W+1, S, 4C]``, ``rollout_log_probs``,
``all_timesteps``, ``window_start``; an ODE request's ``clean_latents`` packed to ``[N, S, 4C]``) and the
conditioning named by the model's adapter, one row for the request's N samples (:func:`shared_row`), read by
``engine.unpack_request_output``.

Editing models (:class:`EditRolloutMixin`) take each request's source images from vLLM-Omni's multimodal
input and denoise together only the requests whose images condition at the same sizes (their tokens line up).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from vllm_omni.diffusion.data import DiffusionOutput

from verl_omni.pipelines.diffusers_adapter import pack_latents
from verl_omni.pipelines.recorder import CLEAN_LATENTS_KEY, RolloutRecorder, shared_row
from verl_omni.pipelines.rollout_output import all_finite, request_output
from verl_omni.pipelines.rollout_request import RolloutRequest, parse_rollout_request, source_images
from verl_omni.pipelines.sampling import SamplingSpec, shared_spec
from verl_omni.pipelines.schedulers.flow_match_sde import schedule_sigmas


class DiffusersRolloutMixin:
    """Put before the vLLM-Omni pipeline class: ``class SD3LogProbPipeline(DiffusersRolloutMixin, StableDiffusion3Pipeline)``."""

    supports_request_batch = True
    # the trajectory recording lives in forward(); the engine's step-execution mode is not wired
    supports_step_execution = False

    @torch.no_grad()
    def forward(self, req) -> list[DiffusionOutput]:
        """A rollout batch through the model's :meth:`rollout_forward`; the engine's start-up warm-up request
        carries text, not token ids, and takes the stock path."""
        if req.is_dummy_run():
            return super().forward(req)
        return self.rollout_forward(req)

    def rollout_forward(self, req) -> list[DiffusionOutput]:
        """One output per request of ``req``: images and trajectory (:meth:`rollout_outputs`)."""
        raise NotImplementedError(f"{type(self).__name__} does not define rollout_forward()")

    def start_batch(self, req) -> tuple[list[RolloutRequest], SamplingSpec]:
        """Each request of ``req`` resolved per sample, and the spec they share (their shape, schedule, guidance)."""
        if not hasattr(self, "request_batch_sizes"):
            # requests per transformer batch, in order: read by the worker extension (batching metric)
            self.request_batch_sizes: list[int] = []
        self.request_batch_sizes.append(req.num_reqs)
        requests = [parse_rollout_request(p, sp) for p, sp in zip(req.prompts, req.sampling_params_list, strict=True)]
        return requests, shared_spec([r.spec for r in requests])

    def conditioning(self, requests: list[RolloutRequest], negative: bool) -> dict[str, torch.Tensor]:
        """The model's conditioning tensors of ``requests``, one row per sample, named as its adapter's
        ``conditioning_keys`` (``cfg_conditioning_keys`` when ``negative``); models that use
        :meth:`conditioned_batch` define it."""
        raise NotImplementedError(f"{type(self).__name__} does not define conditioning()")

    def conditioned_batch(self, req) -> tuple[list[RolloutRequest], SamplingSpec, dict[str, torch.Tensor]]:
        """:meth:`start_batch` and the batch's per-sample :meth:`conditioning`, the negative one too when the
        batch uses CFG."""
        requests, spec = self.start_batch(req)
        return requests, spec, self.prompt_conditioning(requests, spec)

    def prompt_conditioning(self, requests: list[RolloutRequest], spec: SamplingSpec) -> dict[str, torch.Tensor]:
        """The requests' per-sample :meth:`conditioning`, the negative one too when ``spec`` uses CFG."""
        cond = self.conditioning(requests, negative=False)
        if spec.uses_cfg:
            cond |= self.conditioning(requests, negative=True)
        return cond

    def start_schedule(
        self, recorder: RolloutRecorder, spec: SamplingSpec, image_seq_len: int, device: torch.device
    ) -> None:
        """The stock pipeline's timesteps for this batch (``image_seq_len`` sets a dynamic shift), its loop state
        reset as the stock forward resets it, and the recorder's σ table: where each model's denoising starts."""
        timesteps, _ = self.prepare_timesteps(spec.num_inference_steps, None, image_seq_len)
        self._num_timesteps, self._current_timestep, self._interrupt = len(timesteps), None, False
        recorder.set_schedule(schedule_sigmas(self.scheduler, device), timesteps)

    @staticmethod
    def prompt_texts(tokenizer, requests: list[RolloutRequest], negative: bool = False) -> list[str]:
        """The text of each request's prompt ids (the adapter's tokenizer; special tokens dropped), for
        models whose other text encoders have other tokenizers. A missing negative prompt is the empty
        one, as the stock pipelines default it."""
        ids = [r.negative_prompt_token_ids if negative else r.prompt_token_ids for r in requests]
        return [tokenizer.decode(row, skip_special_tokens=True) if row else "" for row in ids]

    @staticmethod
    def per_sample(tensor: torch.Tensor, requests: list[RolloutRequest]) -> torch.Tensor:
        """Rows of one per request repeated to one per sample (request-major, as the recorder orders samples).

        Expanded rows concatenated: a count tensor for ``repeat_interleave`` is a host-device copy (a stream
        sync) and, without the output size, a read-back."""
        rows = [tensor[j : j + 1].expand(r.num_samples, *tensor.shape[1:]) for j, r in enumerate(requests)]
        return torch.cat(rows)

    @staticmethod
    def _request_conditioning(conditioning: dict[str, torch.Tensor], rows: range) -> dict[str, torch.Tensor]:
        """A request's conditioning, once for its samples (:func:`shared_row`), on the device; a ``key`` with a
        ``key_mask`` loses the padding columns only its batch companions needed."""
        out = {k: v[shared_row(rows)].detach() for k, v in conditioning.items()}
        for key in [k for k in out if f"{k}_mask" in out]:
            length = int(out[f"{key}_mask"].sum(dim=1).max())
            out[key], out[f"{key}_mask"] = out[key][:, :length], out[f"{key}_mask"][:, :length]
        return out

    def rollout_outputs(
        self,
        recorder: RolloutRecorder,
        images: torch.Tensor,
        conditioning: dict[str, torch.Tensor],
        packed: bool,
        audio: torch.Tensor | None = None,
        audio_sample_rate: int | None = None,
    ) -> list[DiffusionOutput]:
        """One output per request: its images and its trajectory (latents packed unless ``packed`` already) and,
        for a model with sound, its samples' ``audio`` waveforms ``[N, channels, samples]`` at ``audio_sample_rate``."""
        if not all_finite(images):
            raise FloatingPointError("decoded rollout images have non-finite pixels")
        outputs = []
        # packed on the device: what leaves the device is the layout the trainer reads
        for rows, recorded in zip(recorder.rows(), recorder.split_on_device(), strict=True):
            trajectory: dict[str, Any] = dict(recorded)
            if not packed:
                latents = trajectory["all_latents"]
                n, w1 = latents.shape[:2]
                flat = pack_latents(latents.reshape(n * w1, *latents.shape[2:]))
                trajectory["all_latents"] = flat.reshape(n, w1, *flat.shape[1:])
                if CLEAN_LATENTS_KEY in trajectory:
                    trajectory[CLEAN_LATENTS_KEY] = pack_latents(trajectory[CLEAN_LATENTS_KEY])
            trajectory |= self._request_conditioning(conditioning, rows)
            sound = None if audio is None else audio[rows.start : rows.stop]
            outputs.append(request_output(images[rows.start : rows.stop], trajectory, sound, audio_sample_rate))
        return outputs


class EditRolloutMixin(DiffusersRolloutMixin):
    """An editing model's rollout: each request's 1 to ``max_source_images`` source images
    (:func:`~verl_omni.pipelines.rollout_request.source_images`), sized by :meth:`condition_size`; the requests
    whose images condition at the same sizes are denoised together by :meth:`denoise_edits`."""

    #: how many source images a request may carry
    max_source_images: ClassVar[int] = 1

    def condition_size(self, image, spec: SamplingSpec) -> tuple[int, int]:
        """``(width, height)`` a source image is conditioned at (the model's setting of ``spec``)."""
        raise NotImplementedError(f"{type(self).__name__} does not define condition_size()")

    def denoise_edits(
        self, requests: list[RolloutRequest], sources: list[list], sizes: tuple, spec: SamplingSpec
    ) -> list[DiffusionOutput]:
        """One output per request of ``requests`` (``sources``: their PIL images; ``sizes``: the images'
        condition sizes, the same for all of them)."""
        raise NotImplementedError(f"{type(self).__name__} does not define denoise_edits()")

    def rollout_forward(self, req) -> list[DiffusionOutput]:
        requests, spec = self.start_batch(req)
        sources = [
            source_images(p, rid, self.max_source_images) for p, rid in zip(req.prompts, req.request_ids, strict=True)
        ]
        sizes = [tuple(self.condition_size(image, spec) for image in images) for images in sources]
        outputs: list[DiffusionOutput | None] = [None] * len(requests)
        for key in dict.fromkeys(sizes):
            group = [j for j, s in enumerate(sizes) if s == key]
            done = self.denoise_edits([requests[j] for j in group], [sources[j] for j in group], key, spec)
            for j, output in zip(group, done, strict=True):
                outputs[j] = output
        return outputs

    def resized(self, images: list, sizes: tuple) -> list:
        """``images`` resized to their ``(width, height)`` ``sizes`` by the pipeline's image processor."""
        return [self.image_processor.resize(im, size[1], size[0]) for im, size in zip(images, sizes, strict=True)]

"""vLLM-Omni BAGEL pipeline that samples with the Flow-GRPO SDE step and records log-probs.

Plugged into vLLM-Omni through ``custom_pipeline_args`` (``pipeline_class`` =
``verl_omni.pipelines.bagel.rollout_pipeline.BagelPipelineWithLogProb``), single-stage (the DiT
stage prefills the prompt itself) or as the DiT stage of the thinker + DiT deploy (the prompt's
KV cache arrives from the thinker). It reuses the stock pipeline for the text context, the
packed latent layout, BAGEL's CFG (``Bagel.generate_image``) and VAE decoding; only the step
changes: :class:`BagelSDEStep` puts the shared rollout recorder
(:class:`~verl_omni.pipelines.recorder.RolloutRecorder`: seeds, SDE window, the step on the device)
behind BAGEL's step convention ``step(velocity, σ, x_t, dt)`` with the request's shifted sigmas.

A request's prompt is ``{"prompt_token_ids": [...], "negative_prompt_token_ids": [...]}`` (ids of
``<|im_start|>`` text ``<|im_end|>``, see :func:`~verl_omni.pipelines.bagel.training_adapter.prompt_token_ids`).
The request's :class:`~verl_omni.pipelines.sampling.SamplingSpec` holds the settings:
``num_inference_steps`` counts SDE/ODE transitions (BAGEL's ``num_timesteps`` is one more),
``true_cfg_scale`` is BAGEL's text-CFG scale, and ``model_kwargs`` may set ``timestep_shift``,
``cfg_img_scale``, ``cfg_interval``, ``cfg_renorm_type``, ``cfg_renorm_min``.

Per request the output carries, batched over its N samples, the same layout as Qwen-Image's:
``image`` (N PIL images) and a ``trajectory`` with ``all_latents`` [N, W+1, S, C] (packed latent
tokens), ``rollout_log_probs`` [N, W], ``all_timesteps`` [N, W] (σ), ``window_start`` [N] and the token ids
the trainer replays with, ``prompt_token_ids`` / ``negative_prompt_token_ids`` [N, L] and their masks.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import torch
from vllm_omni.diffusion.data import DiffusionOutput
from vllm_omni.diffusion.models.bagel.bagel_transformer import NaiveCache
from vllm_omni.diffusion.models.bagel.pipeline_bagel import BagelPipeline

from verl_omni.pipelines.bagel.training_adapter import (
    DEFAULT_TIMESTEP_SHIFT,
    guidance_from,
    set_bagel_schedule,
)
from verl_omni.pipelines.recorder import RolloutRecorder, concat_trajectories
from verl_omni.pipelines.rollout_request import RolloutRequest, parse_rollout_request
from verl_omni.pipelines.sampling import SamplingSpec
from verl_omni.pipelines.schedulers.flow_match_sde import FlowMatchSDEDiscreteScheduler, schedule_sigmas

logger = logging.getLogger(__name__)

# how far BAGEL's own σ may be from ours at the same step (it computes the schedule on the latents' device)
SIGMA_TOLERANCE = 1e-4


class BagelSDEStep:
    """The scheduler ``Bagel.generate_image`` steps with: BAGEL's ``step(v, σ, x_t, dt)`` convention in front
    of the shared :class:`~verl_omni.pipelines.recorder.RolloutRecorder` of one sample.

    BAGEL's σ must be the recorder's at every step; the difference is kept on the device and checked
    once after the loop (:meth:`check_schedule`), so stepping reads nothing back to the host.

    Args:
        recorder (`RolloutRecorder`): one sample's recorder, its schedule set to BAGEL's (``set_bagel_schedule``).
    """

    def __init__(self, recorder: RolloutRecorder):
        self.recorder = recorder
        self.max_sigma_error = torch.zeros((), dtype=torch.float32, device=recorder.device)

    def step(self, velocity: torch.Tensor, sigma: torch.Tensor, x_t: torch.Tensor, dt: torch.Tensor, **_: Any):
        """x_t ``[S, C]`` → x_{t'}; BAGEL's ``dt`` is σ − σ' (> 0), which the recorder's schedule must agree with."""
        ours = self.recorder.timesteps[self.recorder.step_index]
        error = (torch.as_tensor(sigma, dtype=torch.float32, device=ours.device) - ours).abs()
        self.max_sigma_error = torch.maximum(self.max_sigma_error, error)
        prev = self.recorder.step(velocity[None], x_t[None])[0]
        return SimpleNamespace(prev_sample=prev, log_prob=None)

    def check_schedule(self) -> None:
        """Raise if BAGEL stepped at a σ other than the recorder's (one host read, after the loop)."""
        error = float(self.max_sigma_error)
        if error > SIGMA_TOLERANCE:
            raise RuntimeError(
                f"BAGEL stepped off the SDE schedule: its σ differs from the recorder's by up to {error:.6f} "
                f"(tolerance {SIGMA_TOLERANCE})"
            )


def _context(kv_len: int) -> dict:
    return {"kv_lens": [kv_len], "ropes": [kv_len]}


class BagelPipelineWithLogProb(BagelPipeline):
    """BAGEL rollout pipeline: token ids in; images, SDE trajectories and log-probs out."""

    # each request of an engine batch is denoised in turn (BAGEL packs one image per forward)
    supports_request_batch = True
    supports_step_execution = False
    # vLLM-Omni's LoRA manager reads fused→logical projection names from ``stacked_params_mapping``
    # attributes; BAGEL's loader keeps its mapping local, so a LoRA on gate_proj/up_proj (the
    # trainer's names) would bind nothing on the fused gate_up_proj without this
    stacked_params_mapping = ((".gate_up_proj", ".gate_proj", 0), (".gate_up_proj", ".up_proj", 1))

    # ---- text context ------------------------------------------------------------------------

    def _prefill(self, token_ids: list[int]) -> dict:
        """KV context of ``token_ids`` by the understanding expert (an empty context for no ids)."""
        context = {**_context(0), "past_key_values": NaiveCache(self.bagel.config.llm_config.num_hidden_layers)}
        if not token_ids:
            return context
        inputs = {
            "text_token_lens": torch.tensor([len(token_ids)], dtype=torch.int, device=self.device),
            "packed_text_ids": torch.tensor(token_ids, dtype=torch.long, device=self.device),
            "packed_text_position_ids": torch.arange(len(token_ids), dtype=torch.long, device=self.device),
        }
        context["past_key_values"] = self.bagel.forward_cache_update_text(context["past_key_values"], **inputs)
        context.update(_context(len(token_ids)))
        return context

    def _contexts(self, request: RolloutRequest, sampling_params) -> tuple[dict, dict]:
        """(conditional, text-unconditional) contexts: from the thinker's KV when injected, else prefilled."""
        injected = sampling_params.past_key_values
        if injected is None:
            return self._prefill(request.prompt_token_ids), self._prefill(request.negative_prompt_token_ids or [])
        cache = NaiveCache.from_object(injected)
        length = cache.key_cache[0].shape[0]
        metadata = sampling_params.kv_metadata or {}
        cond = {"kv_lens": [length], "ropes": metadata.get("ropes", [length]), "past_key_values": cache}
        negative = getattr(sampling_params, "cfg_text_past_key_values", None)
        if negative is None:
            return cond, self._prefill([])
        negative = NaiveCache.from_object(negative)
        n = negative.key_cache[0].shape[0]
        neg_meta = getattr(sampling_params, "cfg_text_kv_metadata", None) or {}
        return cond, {"kv_lens": [n], "ropes": neg_meta.get("ropes", [n]), "past_key_values": negative}

    # ---- one request -------------------------------------------------------------------------

    def _image_shape(self, spec: SamplingSpec) -> tuple[int, int]:
        limit = int(self.bagel.max_latent_size * self.bagel.latent_downsample)
        height, width = spec.height, spec.width
        step = self.bagel.latent_downsample
        if height > limit or width > limit or height % step or width % step:
            raise ValueError(
                f"height/width {height}x{width} must be multiples of {step} and at most {limit} for this checkpoint"
            )
        return height, width

    def _sample(self, request: RolloutRequest, contexts, shape, settings) -> tuple:
        """Denoise the one sample of ``request``; returns (PIL image, its recorded trajectory)."""
        cond, uncond = contexts
        scheduler = FlowMatchSDEDiscreteScheduler()
        set_bagel_schedule(scheduler, settings["num_steps"], settings["timestep_shift"])
        # the generator draws on the CPU: BAGEL's initial noise is a CPU draw on every device
        recorder = RolloutRecorder([request], self.device, generator_device=torch.device("cpu"))
        recorder.set_schedule(schedule_sigmas(scheduler, self.device), scheduler.timesteps)
        stepper = BagelSDEStep(recorder)
        inputs = self.bagel.prepare_vae_latent(cond["kv_lens"], cond["ropes"], [shape], self.new_token_ids)
        noise = inputs["packed_init_noises"]
        inputs["packed_init_noises"] = torch.randn(
            noise.shape, generator=recorder.generators[0], dtype=torch.float32, device="cpu"
        )
        inputs = {k: v.to(self.device) if torch.is_tensor(v) else v for k, v in inputs.items()}
        cfg_text = self.bagel.prepare_vae_latent_cfg(uncond["kv_lens"], uncond["ropes"], [shape])
        cfg_img = self.bagel.prepare_vae_latent_cfg(cond["kv_lens"], cond["ropes"], [shape])
        guidance = settings["guidance"]
        latents, *_ = self.bagel.generate_image(
            past_key_values=cond["past_key_values"],
            cfg_text_past_key_values=uncond["past_key_values"],
            # text-to-image: the image-free branch is the conditional context itself (read-only in the gen pass)
            cfg_img_past_key_values=cond["past_key_values"],
            num_timesteps=settings["num_steps"] + 1,
            timestep_shift=settings["timestep_shift"],
            cfg_text_scale=guidance.text_scale,
            cfg_img_scale=guidance.image_scale,
            cfg_interval=guidance.interval,
            cfg_renorm_min=guidance.renorm_min,
            cfg_renorm_type=guidance.renorm_type,
            cfg_text_packed_position_ids=cfg_text["cfg_packed_position_ids"].to(self.device),
            cfg_img_packed_position_ids=cfg_img["cfg_packed_position_ids"].to(self.device),
            scheduler=stepper,
            **inputs,
        )
        stepper.check_schedule()
        image = self._decode_image_from_latent(self.bagel, self.vae, latents[0], shape)
        (trajectory,) = recorder.split()
        return image, trajectory

    @staticmethod
    def _settings(spec: SamplingSpec) -> dict:
        """BAGEL's schedule and CFG from the spec (its model_kwargs; the text-CFG scale is ``true_cfg_scale``)."""
        return {
            "num_steps": spec.num_inference_steps,
            "timestep_shift": float(spec.model_kwargs.get("timestep_shift", DEFAULT_TIMESTEP_SHIFT)),
            "guidance": guidance_from(spec.model_kwargs, spec.true_cfg_scale),
        }

    def _generate(self, prompt, sampling_params) -> DiffusionOutput:
        request = parse_rollout_request(prompt, sampling_params)
        settings = self._settings(request.spec)
        shape = self._image_shape(request.spec)
        contexts = self._contexts(request, sampling_params)
        images, recorded = [], []
        for i in range(request.num_samples):
            image, trajectory = self._sample(request.sample(i), contexts, shape, settings)
            images.append(image)
            recorded.append(trajectory)
        trajectory = {**concat_trajectories(recorded), **_prompt_ids(request)}
        return DiffusionOutput(output={"payload": {"image": images, "trajectory": trajectory}})

    def forward(self, req) -> list[DiffusionOutput] | DiffusionOutput:
        """Denoise each request of ``req`` in turn; one output per request."""
        if req.is_dummy_run():
            # the engine's start-up warm-up request carries text, not token ids: stock path, at a resolution
            # the checkpoint supports (the engine asks for 512x512, beyond small checkpoints' latent table)
            limit = int(self.bagel.max_latent_size * self.bagel.latent_downsample)
            for sp in req.sampling_params_list:
                sp.height, sp.width = min(sp.height or limit, limit), min(sp.width or limit, limit)
            return super().forward(req)
        # BAGEL's layers mix fp32 inputs (timestep features, latents) with model-dtype weights: the stock
        # pipeline autocasts to the model dtype on accelerators; so do we, on every device (CPU included)
        dtype = self.od_config.dtype
        autocast = torch.autocast(device_type=self.device.type, dtype=dtype, enabled=dtype != torch.float32)
        with torch.inference_mode(), autocast:
            return [self._generate(p, sp) for p, sp in zip(req.prompts, req.sampling_params_list, strict=True)]


def _padded_ids(ids: list[int] | None, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids ``[N, L]`` (the same for the N samples of a request) and an all-ones mask."""
    row = torch.tensor(ids or [], dtype=torch.long)
    return row.expand(n, -1).clone(), torch.ones(n, row.numel(), dtype=torch.long)


def _prompt_ids(request: RolloutRequest) -> dict[str, torch.Tensor]:
    """The token ids the trainer replays with, one row per sample."""
    n = request.num_samples
    prompt_ids, prompt_mask = _padded_ids(request.prompt_token_ids, n)
    negative_ids, negative_mask = _padded_ids(request.negative_prompt_token_ids, n)
    return {
        "prompt_token_ids": prompt_ids,
        "prompt_token_ids_mask": prompt_mask,
        "negative_prompt_token_ids": negative_ids,
        "negative_prompt_token_ids_mask": negative_mask,
    }

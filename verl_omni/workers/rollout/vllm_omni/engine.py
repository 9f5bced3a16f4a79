"""The vLLM-Omni engine as the rollout server uses it: launch, one engine-call helper, unpacking, LoRA.

Kept free of Ray so that it can be driven directly (tests, benchmark); ``vLLMOmniHttpServer``
holds one of these inside its Ray actor.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

import numpy as np
import torch

from verl_omni.pipelines.model_base import get_model_adapter
from verl_omni.pipelines.recorder import CLEAN_LATENTS_KEY, RECORDED_KEYS
from verl_omni.pipelines.rollout_output import AUDIO_KEY, AUDIO_RATE_KEY, all_finite
from verl_omni.pipelines.sampling import EXTRA_ARGS_KEY, SamplingSpec
from verl_omni.platforms.cpu_patches import engine_start_config
from verl_omni.utils.vllm_omni_compat import checkpoint_model_class
from verl_omni.workers.config.rollout import (
    DEFAULT_ENGINE_START_TIMEOUT_S,
    DEFAULT_GENERATION_TIMEOUT_S,
    ENGINE_START_TIMEOUT_KEY,
    GENERATION_TIMEOUT_KEY,
)
from verl_omni.workers.rollout.vllm_omni.schemas import DiffusionOutput

logger = logging.getLogger(__name__)

WORKER_EXTENSION_CLASS = "verl_omni.workers.rollout.vllm_omni.worker_extension.OmniRolloutWorkerExtension"

# How long an idle engine waits for requests to queue up before it starts a transformer batch.
# vLLM-Omni's default (0) starts with the first request of a step and makes the step's other group
# requests wait for that whole denoising loop; with a wait they join it (admission ends as soon as
# no new request came for 50 ms, or ``max_batch_requests`` are queued).
DEFAULT_BATCH_WAIT_MS = 500.0


def build_sampling_params(
    sampling_params: dict[str, Any], num_outputs_per_prompt: int, lora_request=None, adapter=None
):
    """``OmniDiffusionSamplingParams`` for one request from the caller's flat dict (the fields of a
    :class:`~verl_omni.pipelines.sampling.SamplingSpec`, plus an optional ``seed``): the stock fields the
    engine reads, and the whole spec in ``extra_args['sampling_spec']`` for the rollout pipeline. With the
    model ``adapter``, unset guidance takes the model's default and settings the model cannot honour are
    refused here, before the engine sees them."""
    from vllm_omni.inputs.data import OmniDiffusionSamplingParams

    spec, seed = SamplingSpec.from_request_params(sampling_params, adapter)
    fields = {
        "height": spec.height,
        "width": spec.width,
        "num_frames": spec.num_frames,
        "num_inference_steps": spec.num_inference_steps,
        "true_cfg_scale": spec.true_cfg_scale,
    }
    if spec.guidance_scale is not None:
        fields |= {"guidance_scale": spec.guidance_scale, "guidance_scale_provided": True}
    if seed is not None:
        fields["seed"] = seed
    return OmniDiffusionSamplingParams(
        num_outputs_per_prompt=num_outputs_per_prompt,
        extra_args={EXTRA_ARGS_KEY: spec.to_dict()},
        lora_request=lora_request,
        **fields,
    )


def check_source_images(adapter, image_data: list[Any] | None, request_id: str, model_path: str) -> None:
    """An editing model's request carries 1 to ``adapter.max_source_images`` source images; another model's none."""
    count = len(image_data or ())
    if adapter.max_source_images and not 1 <= count <= adapter.max_source_images:
        raise ValueError(
            f"request {request_id} has {count} source images; {model_path} ({adapter.__name__}) edits 1 to "
            f"{adapter.max_source_images} per prompt (the row's data.image_key column)"
        )
    if count and not adapter.max_source_images:
        raise ValueError(
            f"request {request_id} has {count} source images; {model_path} ({adapter.__name__}) takes none"
        )


def _image_to_uint8(image) -> torch.Tensor:
    """PIL image (what a stock vLLM-Omni image post-process returns: BAGEL's, or any model's off the final-pixels
    path) to uint8 ``[3, H, W]``.

    Channel planes from PIL's own split: an RGB image is not converted (a copy) and no strided
    HWC → CHW copy is made (torch's uint8 permute copy cost ~2 ms per 512² image on the GPU host,
    ~1 % of an SD3.5 rollout request of 16 images; the planes cost a tenth of it).
    """
    if image.mode != "RGB":
        image = image.convert("RGB")
    return torch.from_numpy(np.stack([np.asarray(channel, dtype=np.uint8) for channel in image.split()]))


def _request_images(images: list, num_outputs_per_prompt: int) -> list[torch.Tensor]:
    """Per sample, uint8 ``[3, H, W]`` (an image) or ``[F, 3, H, W]`` (a video), from what the engine returned:

    * the request's final pixels (``pipelines.rollout_output``): one uint8 tensor, ``[N, 3, H, W]`` or, for
      videos, ``[N, 3, F, H, W]`` as the video pipelines decode them;
    * off the final-pixels path, the model's post-process output: N PIL images, or one ``[N, F, H, W, 3]``
      array in [0, 1] (vLLM-Omni's video post-processes), rounded as diffusers turns [0, 1] pixels into 8 bits.
    """
    if len(images) == 1 and isinstance(images[0], torch.Tensor) and images[0].dim() in (4, 5):
        pixels = images[0]
        if pixels.dtype != torch.uint8:
            raise RuntimeError(f"engine returned {pixels.dtype} images: the rollout's final pixels are uint8")
        samples = list((pixels.transpose(1, 2) if pixels.dim() == 5 else pixels).unbind(0))
    elif len(images) == 1 and isinstance(images[0], np.ndarray) and images[0].ndim == 5:
        frames = np.clip(np.round(images[0] * 255.0), 0, 255).astype(np.uint8)
        samples = [torch.from_numpy(np.ascontiguousarray(video.transpose(0, 3, 1, 2))) for video in frames]
    else:
        samples = [_image_to_uint8(image) for image in images]
    if len(samples) != num_outputs_per_prompt:
        raise RuntimeError(f"engine returned {len(samples)} images for {num_outputs_per_prompt} samples")
    return samples


def _request_trajectory(output) -> dict[str, torch.Tensor]:
    """The trajectory of one engine request: in the payload (``pipelines.rollout_output``, BAGEL) or, off the
    final-pixels path, in the field vLLM-Omni keeps for it."""
    trajectory = (output.multimodal_output or {}).get("trajectory")
    if trajectory is None and isinstance(getattr(output, "trajectory_latents", None), dict):
        trajectory = output.trajectory_latents
    if trajectory is None:
        raise RuntimeError(
            "engine output has no trajectory payload: is the engine running a log-prob rollout pipeline "
            "(the model adapter's rollout_pipeline)?"
        )
    return trajectory


def unpack_request_output(output, num_outputs_per_prompt: int) -> list[DiffusionOutput]:
    """Split one engine request's output (N images or videos, trajectory batched over N) into N per-sample outputs.

    Every rollout pipeline returns the same layout (the recorder's tensors under the names the trainer
    uses, plus the model's conditioning), so nothing here depends on the model: each recorded entry
    (``RECORDED_KEYS``, an ODE request's ``clean_latents``) has N rows, a conditioning entry N rows or
    the request's one shared row (``recorder.shared_row``), given to every sample as one tensor (pickled
    once when the samples travel together); ``rollout_log_probs`` becomes the sample's ``rollout_log_probs``,
    the others its ``extra_fields`` under the same names. Per-sample rows are views of the request's tensors:
    before they leave the process, :func:`~verl_omni.workers.rollout.vllm_omni.schemas.own_storage`.
    """
    trajectory = _request_trajectory(output)
    images = _request_images(output.images, num_outputs_per_prompt)
    for name, value in trajectory.items():
        per_sample = name in RECORDED_KEYS or name == CLEAN_LATENTS_KEY
        rows = (num_outputs_per_prompt,) if per_sample else (num_outputs_per_prompt, 1)
        if value.shape[0] not in rows:
            raise RuntimeError(f"trajectory {name} has {value.shape[0]} rows for {num_outputs_per_prompt} samples")
    for name in ("all_latents", "rollout_log_probs", "all_timesteps"):
        if not all_finite(trajectory[name]):
            raise FloatingPointError(f"trajectory {name} of request {output.request_id} has non-finite values")
    columns = {
        name: list(value.unbind(0)) if value.shape[0] > 1 else [value[0]] * num_outputs_per_prompt
        for name, value in trajectory.items()
    }
    audio, audio_sample_rate = _request_audio(output, num_outputs_per_prompt)
    outputs = []
    for i, image in enumerate(images):
        extra = {name: rows[i] for name, rows in columns.items() if name != "rollout_log_probs"}
        extra["window_start"] = int(extra["window_start"])
        outputs.append(
            DiffusionOutput(
                diffusion_output=image,
                rollout_log_probs=columns["rollout_log_probs"][i],
                extra_fields=extra,
                audio=None if audio is None else audio[i],
                audio_sample_rate=audio_sample_rate,
            )
        )
    return outputs


def _request_audio(output, num_outputs_per_prompt: int) -> tuple[torch.Tensor | None, int | None]:
    """A model with sound: the request's waveforms ``[N, channels, samples]`` and their rate, from the request
    output's ``multimodal_output`` (``pipelines.rollout_output``); ``(None, None)`` for a silent model."""
    mm = output.multimodal_output or {}
    audio = mm.get(AUDIO_KEY)
    if audio is None:
        return None, None
    rate = mm.get(AUDIO_RATE_KEY)
    if not isinstance(audio, torch.Tensor) or audio.dim() != 3 or audio.shape[0] != num_outputs_per_prompt or not rate:
        shape = tuple(audio.shape) if isinstance(audio, torch.Tensor) else type(audio).__name__
        raise RuntimeError(
            f"request {output.request_id} returned audio {shape} at rate {rate!r}: a rollout's sound is "
            f"[{num_outputs_per_prompt}, channels, samples] with its sample rate"
        )
    if not all_finite(audio):
        raise FloatingPointError(f"audio of request {output.request_id} has non-finite samples")
    return audio, int(rate)


class OmniRolloutEngine:
    """An ``AsyncOmni`` running the model's log-prob pipeline and our worker extension.

    Args:
        model_path: model directory (a diffusers Qwen-Image, a BAGEL checkpoint, ...).
        dtype: engine dtype (``"float32"`` on CPU, ``"bfloat16"`` on GPU).
        max_batch_requests: how many queued requests the engine may denoise in one transformer batch.
        custom_pipeline: dotted path of the rollout pipeline class; defaults to the model adapter's
            ``rollout_pipeline`` (looked up from the checkpoint).
        warmup_size: ``(height, width)`` of the engine's start-up warm-up request (one step) on CPU, the
            size the rollout generates at; None keeps vLLM-Omni's own (512x512).
        engine_start_timeout_s: how long start-up may wait: the orchestrator and each stage
            (``AsyncOmni``'s ``init_timeout`` / ``stage_init_timeout``) and, on CPU, the warm-up's output
            (``actor_rollout_ref.rollout.engine_start_timeout_s``).
        generation_timeout_s: how long one request may take before it is aborted and fails
            (``actor_rollout_ref.rollout.generation_timeout_s``).
        engine_kwargs: further ``AsyncOmni`` keyword arguments, e.g. ``stage_configs_path`` or
            ``deploy_config`` (a multi-stage or single-stage deploy YAML), or
            ``request_batch_max_wait_ms`` (default :data:`DEFAULT_BATCH_WAIT_MS`; 0 disables the wait).
    """

    def __init__(
        self,
        model_path: str,
        dtype: str = "bfloat16",
        max_batch_requests: int = 8,
        custom_pipeline: str | None = None,
        warmup_size: tuple[int, int] | None = None,
        engine_start_timeout_s: float = DEFAULT_ENGINE_START_TIMEOUT_S,
        generation_timeout_s: float = DEFAULT_GENERATION_TIMEOUT_S,
        **engine_kwargs,
    ):
        self.model_path = model_path
        self.dtype = dtype
        self.max_batch_requests = max_batch_requests
        adapter = get_model_adapter(model_path)
        self.pipeline_class = custom_pipeline or adapter.rollout_pipeline
        self.adapter = adapter
        self.engine_start_timeout_s = engine_start_timeout_s
        self.generation_timeout_s = generation_timeout_s
        self.engine_kwargs = {
            "request_batch_max_wait_ms": DEFAULT_BATCH_WAIT_MS,
            **engine_kwargs,
            **_engine_start_kwargs(warmup_size, engine_start_timeout_s, engine_kwargs),
        }
        self.engine = None
        # the adapter every generation uses (a tensor-free request), and the id the next push gets
        self.active_lora = None
        self._next_lora_id = 1
        # one adapter swap at a time: a second push would remove the first before its probe ran
        self._lora_lock = asyncio.Lock()

    def start(self) -> None:
        """Launch the engine (starts the diffusion worker processes); waits at most ``engine_start_timeout_s``."""
        from vllm_omni.entrypoints.async_omni import AsyncOmni

        try:
            self.engine = AsyncOmni(
                model=self.model_path,
                dtype=self.dtype,
                custom_pipeline_args={"pipeline_class": self.pipeline_class},
                worker_extension_cls=WORKER_EXTENSION_CLASS,
                max_num_seqs=self.max_batch_requests,
                **checkpoint_model_class(self.model_path),
                **self.engine_kwargs,
            )
        except TimeoutError as error:
            raise TimeoutError(
                f"the vLLM-Omni engine for {self.model_path} did not start within {self.engine_start_timeout_s:.0f} s "
                f"(waiting for: its orchestrator, stage and workers to come up); raise {ENGINE_START_TIMEOUT_KEY} "
                "to wait longer"
            ) from error

    def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None

    def _require_engine(self):
        if self.engine is None:
            raise RuntimeError("the rollout engine is not started: call start() first")
        return self.engine

    def _diffusion_stages(self) -> list[bool]:
        """Per stage of the engine, whether it is a diffusion stage (a thinker stage is vLLM's AR engine)."""
        clients = getattr(self._require_engine().engine, "stage_clients", None) or []
        return [getattr(c, "stage_type", "") == "diffusion" for c in clients]

    def _stage_sampling_params(self, diffusion_params) -> list[Any]:
        """One entry per stage: the engine's defaults, the caller's for the diffusion stage(s)."""
        stages = self._diffusion_stages()
        if len(stages) <= 1:
            return [diffusion_params]
        defaults = list(self._require_engine().default_sampling_params_list)
        return [diffusion_params if is_diffusion else d for is_diffusion, d in zip(stages, defaults, strict=True)]

    async def engine_call(
        self,
        prompt_token_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        num_outputs_per_prompt: int = 1,
        negative_prompt_token_ids: list[int] | None = None,
        lora_request=None,
        lora_scale: float | None = None,
        image_data: list[Any] | None = None,
    ) -> list[DiffusionOutput]:
        """One engine request for ``num_outputs_per_prompt`` samples of one prompt (the shared helper).

        ``image_data``: the prompt's source images (PIL images; an editing model's), sent once for all samples as
        vLLM-Omni's multimodal input ``prompt["multi_modal_data"]["image"]``.
        ``lora_request`` (a vLLM ``LoRARequest`` of an adapter on disk) and ``lora_scale`` apply to this
        request only; without them the adapter pushed by :meth:`load_lora_tensors` (if any) is used.
        """
        if not isinstance(num_outputs_per_prompt, int) or num_outputs_per_prompt < 1:
            raise ValueError(f"num_outputs_per_prompt must be an int >= 1, got {num_outputs_per_prompt!r}")
        check_source_images(self.adapter, image_data, request_id, self.model_path)
        params = build_sampling_params(
            sampling_params, num_outputs_per_prompt, lora_request or self.active_lora, self.adapter
        )
        if lora_scale is not None:
            params.lora_scale = float(lora_scale)
        stage_params = self._stage_sampling_params(params)
        prompt = {"prompt_token_ids": list(prompt_token_ids)}
        if negative_prompt_token_ids is not None:
            prompt["negative_prompt_token_ids"] = list(negative_prompt_token_ids)
        if image_data:
            # one image as itself, vLLM-Omni's form for one (the stock Wan2.2 I2V pre-process refuses a list); several
            # as a list
            images = list(image_data)
            prompt["multi_modal_data"] = {"image": images[0] if len(images) == 1 else images}
        if len(stage_params) > 1:
            # a thinker stage (vLLM's input processor) needs the output modality
            prompt["modalities"] = ["image"]
        try:
            async with asyncio.timeout(self.generation_timeout_s):
                final = await self._final_output(prompt, request_id, stage_params)
        except TimeoutError as error:
            await self.abort([request_id])
            raise TimeoutError(
                f"engine request {request_id} ({num_outputs_per_prompt} samples, {self.model_path}) did not finish "
                f"within {GENERATION_TIMEOUT_KEY}={self.generation_timeout_s:g} s and was aborted; raise that key if "
                "one request of this size takes longer (long videos, large groups), else the engine lost it"
            ) from error
        if final is None:
            raise RuntimeError(f"engine returned no output for request {request_id}")
        if final.error:
            raise RuntimeError(f"engine request {request_id} failed: {final.error}")
        return unpack_request_output(final, num_outputs_per_prompt)

    async def collective_rpc(self, method: str, *args) -> list[Any]:
        """Call a worker method on every worker of the diffusion stage(s); returns one result per stage.

        A thinker stage (vLLM's AR worker) has neither our worker extension nor in-memory adapters.
        """
        stage_ids = [i for i, is_diffusion in enumerate(self._diffusion_stages()) if is_diffusion] or None
        return await self._require_engine().collective_rpc(method=method, args=args, stage_ids=stage_ids)

    async def _final_output(self, prompt: dict, request_id: str, stage_params: list[Any]):
        """The request's last output (None if the engine streamed none)."""
        final = None
        engine = self._require_engine()
        async for output in engine.generate(prompt=prompt, request_id=request_id, sampling_params_list=stage_params):
            # a multi-stage engine also streams the thinker's text output: keep the image stage's
            if output.error or final is None or output.images:
                final = output
        return final

    async def abort(self, request_ids: list[str]) -> None:
        await self._require_engine().abort(request_ids)

    async def load_lora_tensors(
        self, peft_config: dict[str, Any], tensors: dict[str, torch.Tensor] | None = None, shared=None, broadcast=None
    ) -> list[str]:
        """Make an in-memory adapter the one every generation uses; returns the modules it binds.

        The adapter comes as host ``tensors``; or as ``shared``: a list of
        :class:`~verl_omni.workers.rollout.device_share.SharedTensors` (one per sender GPU) that each worker
        opens by CUDA IPC on its own GPU; or as ``broadcast``: the
        :class:`~verl_omni.workers.rollout.collective_share.BroadcastTensors` of the buffer the sender broadcasts
        through the weight group meanwhile. It gets a new id (vLLM-Omni caches adapters by id), is probed in the
        worker, and only then replaces the previous one (removed). An adapter binding no module is removed and
        raises ``ValueError``.
        """
        if sum(given is not None for given in (tensors, shared, broadcast)) != 1:
            raise ValueError("load_lora_tensors takes the adapter as host, shared or broadcast tensors, one of them")
        async with self._lora_lock:
            return await self._swap_lora(peft_config, tensors, shared, broadcast)

    async def _swap_lora(self, peft_config: dict[str, Any], tensors, shared, broadcast) -> list[str]:
        from vllm.lora.request import LoRARequest

        from verl_omni.workers.rollout.vllm_omni.lora import in_memory_lora_path

        adapter_id = self._next_lora_id
        self._next_lora_id += 1
        # plain fields through our own RPC: a multi-stage engine's IPC rebuilds ``add_lora``'s request
        # as a plain LoRARequest, dropping the tensors (and reports success while nothing was added)
        request = {
            "lora_name": f"verl_omni_lora_{adapter_id}",
            "lora_int_id": adapter_id,
            "lora_path": in_memory_lora_path(adapter_id),
        }
        fields = {**request, "peft_config": dict(peft_config)}
        if shared is not None:
            fields["shared_tensors"] = list(shared)
            names = shared[0].names
        elif broadcast is not None:
            fields["broadcast_tensors"] = broadcast
            names = broadcast.names
        else:
            fields["lora_tensors"] = {name: t.detach().cpu().contiguous() for name, t in tensors.items()}
            names = sorted(tensors)
        added = _flatten(await self.collective_rpc("verl_omni_add_lora", fields))
        if not added or not all(added):
            raise RuntimeError(f"vLLM-Omni did not load LoRA adapter {adapter_id} (per worker: {added})")
        probes = _flatten(await self.collective_rpc("verl_omni_lora_binding", adapter_id))
        bound = sorted({name for probe in probes for name in probe["bound"]})
        unused = sorted({name for probe in probes for name in probe["unused"]})
        if not bound or unused:
            await self.collective_rpc("remove_lora", adapter_id)
            what = "binds no module" if not bound else f"has weights that bind no module: {unused[:8]}"
            raise ValueError(
                f"LoRA adapter {what} of the rollout model (tensor names like {sorted(names)[:4]}, "
                f"target_modules={peft_config.get('target_modules')}): fix the names or target_modules"
            )
        await self.clear_lora()
        self.active_lora = LoRARequest(**request)
        logger.info("LoRA adapter %d active, bound to %d modules", adapter_id, len(bound))
        return bound

    # ---- the weight group (verl_omni.workers.rollout.collective_share) ----------------------------

    async def worker_count(self) -> int:
        """The diffusion worker processes of this engine (each is a member of the weight group)."""
        return len(_flatten(await self.collective_rpc("verl_omni_worker_rank")))

    async def join_weight_group(self, group, first_rank: int) -> None:
        """Every diffusion worker joins the weight ``group`` as member ``first_rank`` + its rank (returns once the
        whole group, the sender included, has joined)."""
        if sum(self._diffusion_stages()) > 1:
            raise NotImplementedError(
                f"{self.model_path}: the weight group numbers one diffusion stage's workers; this engine has "
                f"{sum(self._diffusion_stages())}"
            )
        await self.collective_rpc("verl_omni_join_weight_group", group, first_rank)

    # ---- full-weight sync (verl_omni.workers.rollout.weight_buckets) ---------------------------

    def _weight_prefix(self) -> str:
        prefix = self.adapter.rollout_weight_prefix
        if prefix is None:
            raise NotImplementedError(
                f"{self.adapter.__name__} has no full-weight sync (rollout_weight_prefix is None): train a LoRA "
                "(actor_rollout_ref.model.lora.rank > 0)"
            )
        return prefix

    async def begin_weight_sync(self, version: int, count: int, complete: bool = True) -> None:
        """Open sync ``version`` of ``count`` buckets in every diffusion worker; ``complete``: of the whole
        transformer (else of some of its weights, the merged LoRA's: each name sent must set a parameter)."""
        _raise_sync_errors(
            await self.collective_rpc("verl_omni_begin_weight_sync", version, count, self._weight_prefix(), complete)
        )

    async def load_weight_bucket(self, bucket) -> int:
        """Check and load one :class:`~verl_omni.workers.rollout.weight_buckets.WeightBucket` in every worker;
        returns the names set per worker (the least of them)."""
        reports = _raise_sync_errors(await self.collective_rpc("verl_omni_load_weight_bucket", bucket.to_fields()))
        return min(report["loaded"] for report in reports)

    async def finish_weight_sync(self, version: int) -> dict[str, int]:
        """Close sync ``version``; raises ``WeightSyncError`` unless every bucket arrived intact and every parameter
        of the rollout's transformer was written. Returns the first worker's ``{"buckets", "bytes", "params"}``."""
        return _raise_sync_errors(await self.collective_rpc("verl_omni_finish_weight_sync", version))[0]

    async def load_weights(self, weights: dict[str, torch.Tensor], version: int = 0, bucket_bytes: int = 1 << 30):
        """Replace the transformer's weights (diffusers names) with ``weights``: one checked sync of buckets, as the
        trainer's full-weight payload sends them (used to set an engine's weights from a state dict directly)."""
        from verl_omni.workers.rollout.weight_buckets import buckets_of

        buckets = list(buckets_of(version, weights, bucket_bytes))
        await self.begin_weight_sync(version, len(buckets))
        for bucket in buckets:
            await self.load_weight_bucket(bucket)
        return await self.finish_weight_sync(version)

    async def clear_lora(self) -> None:
        """Stop using (and unload) the active adapter, if any."""
        if self.active_lora is not None:
            await self.collective_rpc("remove_lora", self.active_lora.lora_int_id)
            self.active_lora = None

    async def request_batch_sizes(self) -> list[int]:
        """Requests per transformer batch of every rollout forward so far (engine-side count)."""
        return _flatten(await self.collective_rpc("verl_omni_request_batch_sizes"))


def _engine_start_kwargs(warmup_size, timeout_s: float, engine_kwargs: dict) -> dict:
    """``AsyncOmni`` kwargs bounding the start by ``timeout_s`` and sizing the CPU warm-up (see ``cpu_patches``)."""
    taken = sorted({"init_timeout", "stage_init_timeout"} & set(engine_kwargs))
    if taken:
        raise ValueError(
            f"engine_kwargs.vllm_omni.{taken[0]} is set by {ENGINE_START_TIMEOUT_KEY}: set that key instead"
        )
    seconds = math.ceil(timeout_s)
    additional = dict(engine_kwargs.get("additional_config") or {})
    additional.update(engine_start_config(warmup_size, timeout_s, ENGINE_START_TIMEOUT_KEY))
    return {"init_timeout": seconds, "stage_init_timeout": seconds, "additional_config": additional}


def _raise_sync_errors(stage_results: list[Any]) -> list[dict]:
    """The workers' weight-sync reports; the first ``{"error"}`` among them raised as ``WeightSyncError``."""
    from verl_omni.workers.rollout.weight_buckets import WeightSyncError

    reports = _flatten(stage_results)
    errors = [report["error"] for report in reports if "error" in report]
    if errors:
        raise WeightSyncError(f"{errors[0]} ({len(errors)} of {len(reports)} rollout workers failed)")
    return reports


def _flatten(stage_results: list[Any]) -> list[Any]:
    """collective_rpc returns per stage either a worker's list or a list of worker lists."""
    items: list[Any] = []
    for result in stage_results:
        if isinstance(result, dict):
            raise RuntimeError(f"worker RPC failed: {result}")
        if isinstance(result, list) and result and isinstance(result[0], list):
            for worker_result in result:
                items.extend(worker_result)
        elif isinstance(result, list):
            items.extend(result)
        else:
            items.append(result)
    return items

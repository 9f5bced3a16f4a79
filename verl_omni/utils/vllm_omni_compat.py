"""Where verl_omni works around gaps of vLLM-Omni on every device: each gap named, with its version gate.

vLLM-Omni has no public way yet to do a few things our rollout needs, and one race of its executor loses a request
(listed in :data:`PIPELINE_GAPS`, each with the upstream place that lacks it). Each workaround here reaches into a private vLLM-Omni API only while
:func:`gap_open` says the installed version is one the gap was seen open in; on another version it is skipped
with a warning naming the gap and where to extend its versions. Remove a gap once vLLM-Omni closes it.

This module imports nothing of verl_omni (vLLM-Omni lazily, inside each workaround), so every layer may use it:
the model pipelines, the rollout engine and the platform plugins. The CPU platform's own patches, applied only
when that platform is active, are :mod:`verl_omni.platforms.cpu_patches`.
"""

from __future__ import annotations

import concurrent.futures
import functools
import inspect
import json
import logging
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

# gap name -> vLLM-Omni versions it was seen open in (each gap's workaround below names it)
PIPELINE_GAPS = {
    # vllm_omni/diffusion/models/z_image/pipeline_z_image.py: ``ZImagePipeline.__init__`` calls
    # ``ZImageTransformer2DModel()`` with the released 6B model's sizes, ignoring ``transformer/config.json``
    "z_image_transformer_sizes": ("0.26.",),
    # vllm_omni/diffusion/diffusion_engine.py: ``DiffusionEngine.postprocess_output`` always runs the model's
    # post-process (SD3, FLUX, Z-Image, Qwen-Image: float images to PIL); a pipeline cannot return final pixels
    # (only SD3's and FLUX's honour ``output_type="latent"``). Read with it: vllm_omni/diffusion/ipc.py
    # ``_SHM_TENSOR_THRESHOLD``, above which the worker moves an output tensor through shared memory
    "final_pixels_postprocess": ("0.26.",),
    # vllm_omni/diffusion/models/qwen_image/pipeline_qwen_image_edit.py: ``get_qwen_image_edit_pre_process_func``
    # sizes the source image at a fixed 1024² pixels (``calculate_dimensions(1024 * 1024, ratio)``, a literal in
    # the pre-process; ``pipeline_qwen_image_edit_plus.py``: the constants ``VAE_IMAGE_SIZE`` and
    # ``CONDITION_IMAGE_SIZE``): no sampling parameter or engine config sets the stock conditioning area
    "qwen_image_edit_condition_area": ("0.26.",),
    # vllm_omni/diffusion/executor/multiproc_executor.py: ``MultiprocDiffusionExecutor._result_pump``, given a
    # request's OUTPUT_READY, looks for the request's waiter in ``_output_futures`` and, finding none, parks the output
    # in ``_completed_outputs`` under a second, separate hold of ``_futures_lock``; ``wait_output_ready`` called
    # between the two holds registers a waiter that nothing resolves (the request hangs with its output parked)
    "async_output_handover": ("0.26.",),
    # vllm_omni/config/config_factory.py: ``StageConfigFactory._try_infer_model_type``, finding no model type in a
    # diffusers checkpoint's files, matches the directory's name against its pipeline registry's keys, and that
    # pipeline's ``model_arch`` then names the served class: a HunyuanVideo-1.5 image-to-video checkpoint in a
    # directory whose name holds ``hunyuan_video_15`` is served as the text-to-video ``HunyuanVideo15Pipeline`` (its
    # warm-up sends no source image and fails)
    "model_class_from_directory_name": ("0.26.",),
    # vllm_omni/diffusion/models/mistral_encoder/mistral_encoder.py: ``MistralEncoderModel.__init__`` reads the RoPE
    # base as ``text_config.rope_theta`` (default 1e6); transformers 5 configs hold it in ``rope_parameters`` only, so
    # FLUX.2-dev's text encoder (the Mistral Small 3 config's θ = 1e9) rotates with θ = 1e6
    "mistral_encoder_rope_theta": ("0.26.",),
}


def gap_open(name: str, installed: str | None = None) -> bool:
    """Whether vLLM-Omni ``installed`` (default: the installed one) is a version gap ``name`` was seen open in."""
    versions = PIPELINE_GAPS[name]
    if installed is None:
        from vllm_omni.version import __version__ as installed
    if installed.startswith(versions):
        return True
    logger.warning(
        "verl_omni works around vLLM-Omni gap %r for vllm-omni %s, found %s: workaround not applied. If the gap is "
        "still open in this version, extend PIPELINE_GAPS[%r] in %s",
        name,
        "/".join(v + "x" for v in versions),
        installed,
        name,
        __name__,
    )
    return False


@contextmanager
def z_image_transformer_from_checkpoint(model_path: str, installed: str | None = None):
    """While ``ZImagePipeline.__init__`` runs, its transformer class takes the checkpoint's config.

    Gap ``z_image_transformer_sizes``: vLLM-Omni 0.26 builds the transformer with the released model's
    sizes (dim 3840, 30 layers), so any other checkpoint (a tiny one, a distilled one) fails to load
    ("Tried to load weights of size [32] to a parameter of size [3840]"). Only the keys the class's
    constructor accepts are passed.
    """
    config_file = Path(model_path) / "transformer" / "config.json"
    if not config_file.is_file() or not gap_open("z_image_transformer_sizes", installed):
        yield
        return
    from vllm_omni.diffusion.models.z_image import pipeline_z_image

    original = pipeline_z_image.ZImageTransformer2DModel
    accepted = inspect.signature(original.__init__).parameters
    config = {k: v for k, v in json.loads(config_file.read_text()).items() if k in accepted}
    pipeline_z_image.ZImageTransformer2DModel = functools.partial(original, **config)
    try:
        yield
    finally:
        pipeline_z_image.ZImageTransformer2DModel = original


@contextmanager
def qwen_image_edit_condition_area(area: float, installed: str | None = None):
    """While open, vLLM-Omni's Qwen-Image-Edit pre-processes (every engine of this process: they run in the
    engine's process, before its worker) size source images to ``area`` pixels at their aspect ratio instead of
    the stock 1024² (Qwen-Image-Edit-Plus: its VAE's 1024² and its vision tower's 384² both); yields whether the
    override is in place.

    Gap ``qwen_image_edit_condition_area``: the stock areas are a literal and module constants, so neither a
    benchmark that compares the stock pipeline with ours at another area (ours: ``model_kwargs.condition_area``;
    the CPU smoke run's tiny model would condition on ~16k latent tokens at 1024²) nor the CPU warm-up at the
    rollout's size (:mod:`verl_omni.platforms.cpu_patches`) can ask for it otherwise. Upstream's
    ``calculate_dimensions`` rounds the sides to 32 px as our ``rollout_request.condition_size`` does, so both
    pipelines condition at the same size (ours also keeps 32 px a side at least, upstream's does not). Our rollout pipelines read the raw source images,
    not the pre-processed ones, so only stock pipelines see the difference.
    """
    if not gap_open("qwen_image_edit_condition_area", installed):
        yield False
        return
    from vllm_omni.diffusion.models.qwen_image import pipeline_qwen_image_edit, pipeline_qwen_image_edit_plus

    modules = (pipeline_qwen_image_edit, pipeline_qwen_image_edit_plus)
    originals = [module.calculate_dimensions for module in modules]

    def at_area(_stock_area: float, ratio: float):
        return originals[0](area, ratio)

    for module in modules:
        module.calculate_dimensions = at_area
    try:
        yield True
    finally:
        for module, original in zip(modules, originals, strict=True):
            module.calculate_dimensions = original


# ---- final pixels: the engine passes a rollout's uint8 images through (every device) ----------------

# the every-device engine patches applied in this process
_gaps_worked_around: set[str] = set()

# A rollout pipeline's per-request output is ``{ENVELOPE_KEY: {IMAGE_KEY: pixels, ...}}``
# (``verl_omni.pipelines.rollout_output``); uint8 pixels there mark it final, which no stock pipeline's output is.
ENVELOPE_KEY = "payload"
IMAGE_KEY = "image"


def mistral_encoder_rope_theta(text_encoder, installed: str | None = None) -> bool:
    """Give vLLM-Omni's Mistral text encoder (``MistralEncoderModel``, FLUX.2-dev's) the RoPE base its config states;
    True when its rotary table was rebuilt.

    Gap ``mistral_encoder_rope_theta``: vLLM-Omni 0.26 reads ``config.rope_theta``, which a transformers 5 config
    lacks (``rope_parameters["rope_theta"]`` holds it), and falls back to 1e6: every token after the first few is
    rotated unlike the released encoder (and transformers' Mistral3, diffusers' text encoder) rotates it.
    """
    config = text_encoder.config
    theta = getattr(config, "rope_theta", None) or (getattr(config, "rope_parameters", None) or {}).get("rope_theta")
    rotary = text_encoder.language_model.model.rotary_emb
    head_dim = text_encoder.head_dim
    expected = 1.0 / (float(theta) ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)) if theta else None
    if expected is None or torch.allclose(rotary.inv_freq.cpu(), expected, rtol=1e-6, atol=0):
        return False
    if not gap_open("mistral_encoder_rope_theta", installed):
        return False
    rotary.inv_freq = expected.to(rotary.inv_freq.device)
    return True


def is_final_pixels_output(output: Any) -> bool:
    """Whether a pipeline output is final: an envelope whose image is uint8 pixels (the post-processes this
    skips turn float images into pixels; no stock pipeline returns uint8 images in an envelope)."""
    if not isinstance(output, dict) or not isinstance(output.get(ENVELOPE_KEY), dict):
        return False
    image = output[ENVELOPE_KEY].get(IMAGE_KEY)
    return isinstance(image, torch.Tensor) and image.dtype == torch.uint8


@functools.cache
def final_pixels_passthrough(installed: str | None = None) -> bool:
    """Whether rollout pipelines return final pixels (``verl_omni.pipelines.rollout_output``): gap
    ``final_pixels_postprocess`` is open in this vLLM-Omni version, so :func:`patch_final_pixels_postprocess`
    passes them through. Both sides ask this (the worker's pipeline and the engine's general plugin), so they
    agree; cached: one warning."""
    return gap_open("final_pixels_postprocess", installed)


def shm_tensor_threshold() -> int:
    """Bytes above which vLLM-Omni's worker moves an output tensor through shared memory (the rest is pickled)."""
    from vllm_omni.diffusion import ipc

    return ipc._SHM_TENSOR_THRESHOLD


def _passing_final_pixels(post_process):
    @functools.wraps(post_process)
    def post_process_or_pass(output, *args, **kwargs):
        """The model's post-process, except for a rollout's final pixels, returned as they are."""
        return output if is_final_pixels_output(output) else post_process(output, *args, **kwargs)

    return post_process_or_pass


def _make_final_pixels_lookup(original):
    def post_process_lookup(od_config):
        """The model's post-process (None: none), wrapped to pass final pixels through."""
        post_process = original(od_config)
        return None if post_process is None else _passing_final_pixels(post_process)

    return post_process_lookup


def patch_final_pixels_postprocess(installed: str | None = None) -> bool:
    """Gap ``final_pixels_postprocess``: every engine built after this call wraps its model's post-process so
    that a rollout output whose image is already uint8 pixels passes unchanged (any other output, e.g. a stock
    pipeline's in the same process, is post-processed as before). The wrapper keeps the post-process's
    signature (``functools.wraps``), which the engine inspects for a ``sampling_params`` parameter. Applied from
    the general plugin on every device; returns whether it is in place. Remove once vLLM-Omni lets a pipeline
    mark its output final."""
    if not final_pixels_passthrough(installed):
        return False
    if "final_pixels_postprocess" in _gaps_worked_around:
        return True
    from vllm_omni.diffusion import diffusion_engine

    lookup = diffusion_engine.get_diffusion_post_process_func
    diffusion_engine.get_diffusion_post_process_func = _make_final_pixels_lookup(lookup)
    _gaps_worked_around.add("final_pixels_postprocess")
    logger.info("verl_omni engine patch applied: final rollout pixels pass the post-process")
    return True


# ---- async outputs: a finished request's output reaches a waiter that registered late (every device) ----------


class _HandingOverOutputs(dict):
    """An executor's ``_completed_outputs`` (async output id -> the done future of that output) that gives an output
    to the waiter registered for its id (in ``waiters``, the executor's ``_output_futures``) instead of parking it.

    The result pump stores here and ``wait_output_ready`` registers a waiter while each holds the executor's
    ``_futures_lock``, so the look-up below and a registration are ordered: a waiter registered before the store is
    resolved here, one registered after finds the output parked. Without a waiter the output is parked as upstream
    parks it."""

    def __init__(self, waiters: dict, parked: dict):
        super().__init__(parked)
        self._waiters = waiters

    def __setitem__(self, output_id, done: concurrent.futures.Future) -> None:
        waiter = self._waiters.pop(output_id, None)
        if waiter is None or waiter.done():
            super().__setitem__(output_id, done)
            return
        done.add_done_callback(functools.partial(_resolve_waiter, waiter))


def _resolve_waiter(waiter: concurrent.futures.Future, done: concurrent.futures.Future) -> None:
    """``waiter`` takes ``done``'s result or exception (unless the waiter gave up meanwhile)."""
    if waiter.done():
        return
    if done.cancelled():
        waiter.cancel()
    elif (error := done.exception()) is not None:
        waiter.set_exception(error)
    else:
        waiter.set_result(done.result())


def _make_handing_over_start(start_pump):
    @functools.wraps(start_pump)
    def start_pump_handing_over(self):
        """The executor's result pump, started once its output cache hands outputs to late waiters."""
        with self._futures_lock:
            self._completed_outputs = _HandingOverOutputs(self._output_futures, self._completed_outputs)
        return start_pump(self)

    return start_pump_handing_over


def patch_async_output_handover(installed: str | None = None) -> bool:
    """Gap ``async_output_handover``: every diffusion executor started after this call resolves a request whose
    waiter registered while the result pump was between finding no waiter and parking the output (else the request
    waits for the engine's output timeout, then the rollout's ``generation_timeout_s``, with its output parked).
    Applied from the general plugin on every device; returns whether it is in place. Remove once vLLM-Omni's pump
    checks for a waiter and parks the output under one hold of its lock."""
    if not gap_open("async_output_handover", installed):
        return False
    if "async_output_handover" in _gaps_worked_around:
        return True
    from vllm_omni.diffusion.executor.multiproc_executor import MultiprocDiffusionExecutor

    MultiprocDiffusionExecutor._start_result_pump = _make_handing_over_start(
        MultiprocDiffusionExecutor._start_result_pump
    )
    _gaps_worked_around.add("async_output_handover")
    logger.info("verl_omni engine patch applied: a finished request's output reaches a waiter that registered late")
    return True


def checkpoint_model_class(model_path: str | Path, installed: str | None = None) -> dict[str, str]:
    """``AsyncOmni`` kwargs that serve a diffusers checkpoint as its ``model_index.json`` class: ``{"model_class_name":
    <_class_name>}`` when vLLM-Omni would infer another pipeline from the directory's name
    (``model_class_from_directory_name``), else none."""
    index = Path(model_path) / "model_index.json"
    if not index.is_file() or not gap_open("model_class_from_directory_name", installed):
        return {}
    class_name = json.loads(index.read_text()).get("_class_name")
    from vllm_omni.config.config_factory import StageConfigFactory
    from vllm_omni.config.pipeline_registry import OMNI_PIPELINES

    model_type = StageConfigFactory.try_infer_model_type(str(model_path), trust_remote_code=False)
    inferred = OMNI_PIPELINES.get(model_type)
    inferred = inferred(None) if callable(inferred) else inferred
    arch = getattr(inferred, "diffusers_class_name", None)
    if class_name is None or arch is None or arch == class_name:
        return {}
    logger.info("vLLM-Omni infers %s for %s from its directory name: served as its %s", arch, model_path, class_name)
    return {"model_class_name": class_name}

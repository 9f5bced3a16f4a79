"""The CPU platform's patches of private vLLM-Omni internals, applied only when that platform is active.

Each patch of :data:`PATCHES` names the upstream gap it fills, checks the vLLM-Omni version it was written
for (:data:`PATCHED_VLLM_OMNI_VERSIONS`), is idempotent, and is applied by
:func:`verl_omni.platforms.omni_general_plugin` when our CPU platform is active. Remove a patch once vLLM-Omni
ships a CPU platform with the same behaviour. The gaps worked around on every device are
:mod:`verl_omni.utils.vllm_omni_compat`'s.
"""

import concurrent.futures
import logging
import threading
import time
from contextlib import contextmanager

from verl_omni.utils.vllm_omni_compat import qwen_image_edit_condition_area

logger = logging.getLogger(__name__)

PATCHED_VLLM_OMNI_VERSIONS = ("0.26.",)
_applied: set[str] = set()
BATCH_OUTPUT_TIMEOUT_S = 60.0
# how long a request waits for its packed output on CPU (vLLM-Omni 0.26 waits 30 s); the request's own bound,
# the engine's generation timeout, still applies
OUTPUT_READY_TIMEOUT_S = 600.0


def _version_supported(installed: str | None = None) -> bool:
    """Whether ``installed`` (default: ``vllm_omni.__version__``) is a version these patches were written for."""
    if installed is None:
        from vllm_omni.version import __version__ as installed
    if installed.startswith(PATCHED_VLLM_OMNI_VERSIONS):
        return True
    logger.warning(
        "verl_omni CPU patches were written for vllm-omni %s, found %s: not applied (%s). The engine may "
        "fail on CPU: its warm-up runs at vLLM-Omni's own size and waits on its own private timeout; "
        "check each patch's gap against this version, then extend PATCHED_VLLM_OMNI_VERSIONS in %s",
        "/".join(v + "x" for v in PATCHED_VLLM_OMNI_VERSIONS),
        installed,
        ", ".join(PATCHES),
        __name__,
    )
    return False


# One WorkerProc per worker process: its main thread and output thread share this queue writer.
_RESULT_MQ_LOCK = threading.Lock()


def _cpu_async_output_loop(self) -> None:
    """CPU variant of ``WorkerProc._async_output_loop``: pack and reply, no device stream."""
    from vllm_omni.diffusion.data import AsyncDiffusionOutput, AsyncOutputKind
    from vllm_omni.diffusion.worker import diffusion_worker

    while self._running:
        output, async_output_id, _event = self._async_output_queue.get()
        try:
            diffusion_worker.pack_diffusion_output_shm(output)
            reply = AsyncDiffusionOutput(
                kind=AsyncOutputKind.OUTPUT_READY, async_output_id=async_output_id, output=output
            )
        except (RuntimeError, ValueError, OSError, TypeError):
            logger.exception("Packing diffusion output %s failed; replying with an error", async_output_id)
            reply = AsyncDiffusionOutput(
                kind=AsyncOutputKind.OUTPUT_READY, async_output_id=async_output_id, error="CPU output packing failed"
            )
        with _RESULT_MQ_LOCK:
            self.result_mq.enqueue(reply)


def _make_locked_return_result(original):
    def _locked_return_result(self, output, rpc_id=None):
        """The original reply, holding the lock the output thread writes under (COMPUTE_DONE goes first)."""
        with _RESULT_MQ_LOCK:
            return original(self, output, rpc_id)

    return _locked_return_result


def patch_async_output_loop() -> None:
    """Gap: vLLM-Omni 0.26 ``WorkerProc._async_output_loop`` builds a ``torch.Stream`` on
    ``torch.accelerator.current_accelerator()`` (``cuda`` on a CUDA-build torch without a GPU: the
    thread dies) to overlap the output copy with compute, and then writes to the result queue
    from that thread while the main thread writes too. On CPU there is no copy to overlap: the loop
    packs directly, and both writers share a lock so that COMPUTE_DONE always precedes OUTPUT_READY."""
    if "async_output_loop" in _applied:
        return
    from vllm_omni.diffusion.worker.diffusion_worker import WorkerProc

    WorkerProc._async_output_loop = _cpu_async_output_loop
    WorkerProc._return_result = _make_locked_return_result(WorkerProc._return_result)
    _applied.add("async_output_loop")
    logger.info("verl_omni CPU patch applied: WorkerProc output thread")


def _split_cached_batch_output(executor, batch_id: str, per_req_map: dict[str, str], cached) -> None:
    """Resolve each request of a batch from the whole-batch output the result pump cached."""
    from vllm_omni.diffusion.data import DiffusionOutput

    try:
        batch_output = cached.result()
    except RuntimeError as error:
        batch_output, batch_error = None, str(error)
    for per_req_id, req_id in per_req_map.items():
        req_output = batch_output.get_request_output(req_id) if batch_output is not None else None
        if req_output is not None and req_output.result is not None:
            result = req_output.result
        else:
            result = DiffusionOutput(
                error=batch_error if batch_output is None else "No output result for batch request"
            )
        pending = executor._output_futures.pop(per_req_id, None)
        if pending is not None and not pending.done():
            pending.set_result(result)
        else:
            done = concurrent.futures.Future()
            done.set_result(result)
            executor._completed_outputs[per_req_id] = done


def _make_settled_execute_batch(original):
    def _settled_execute_batch(self, scheduler_output):
        """``execute_batch``, then wait until the result pump has either split the batch's output
        or cached it whole (it arrived before the split map existed); split a cached one here."""
        result = original(self, scheduler_output)
        batch_ids = {
            out.async_output_id.rsplit("/", 1)[0]
            for out in getattr(result, "runner_outputs", None) or []
            if out.async_output_id and "/" in out.async_output_id
        }
        deadline = time.monotonic() + BATCH_OUTPUT_TIMEOUT_S
        while batch_ids:
            with self._futures_lock:
                for batch_id in list(batch_ids):
                    if batch_id not in self._batch_split_map:
                        batch_ids.discard(batch_id)  # the pump took the map and splits the output
                        continue
                    cached = self._completed_outputs.pop(batch_id, None)
                    if cached is not None:
                        per_req_map = self._batch_split_map.pop(batch_id)
                        _split_cached_batch_output(self, batch_id, per_req_map, cached)
                        batch_ids.discard(batch_id)
            if batch_ids and time.monotonic() > deadline:
                raise TimeoutError(f"no output for diffusion batch {sorted(batch_ids)}")
            if batch_ids:
                time.sleep(0.001)
        return result

    return _settled_execute_batch


def patch_batch_output_split() -> None:
    """Gap: vLLM-Omni 0.26 ``MultiprocDiffusionExecutor.execute_batch`` registers how to split a
    multi-request batch's output only after COMPUTE_DONE came back; if OUTPUT_READY is processed
    first, the result pump caches it under the batch id and the batch's requests wait until they
    time out. On GPU the output copy's delay hides this; on CPU the output is ready at once."""
    if "batch_output_split" in _applied:
        return
    from vllm_omni.diffusion.executor.multiproc_executor import MultiprocDiffusionExecutor

    MultiprocDiffusionExecutor.execute_batch = _make_settled_execute_batch(MultiprocDiffusionExecutor.execute_batch)
    _applied.add("batch_output_split")
    logger.info("verl_omni CPU patch applied: MultiprocDiffusionExecutor.execute_batch")


def _sdpa_forward_cpu(self, query, key, value, attn_metadata=None):
    """Plain torch SDPA; ``forward_cuda`` holds the device-neutral torch implementation."""
    return self.forward_cuda(query, key, value, attn_metadata)


def patch_sdpa_dispatch() -> None:
    """Gap: vLLM-Omni 0.26 ``AttentionImpl.forward`` dispatches only to cuda/hip/npu/xpu/musa
    variants and raises for any other platform, although its torch-SDPA implementation
    (the one it forces for fp32) has nothing device-specific; route CPU to that one."""
    if "sdpa_dispatch" in _applied:
        return
    from vllm_omni.diffusion.attention.backends.sdpa import SDPAImpl

    SDPAImpl.forward = _sdpa_forward_cpu
    _applied.add("sdpa_dispatch")
    logger.info("verl_omni CPU patch applied: SDPAImpl.forward")


def _native_forward_uncompiled(self, fn, *, enable: bool = True):
    """The native forward as it is: on CPU the op runs eagerly."""
    return fn


def patch_custom_op_compile() -> None:
    """Gap: vLLM 0.26 ``CustomOp.maybe_compile`` (the vLLM that vLLM-Omni 0.26 runs on) ``torch.compile``s the native
    forward of every custom op that is off by default (``SiluAndMul`` in the Mistral, Qwen and Gemma text encoders of
    FLUX.2, HunyuanVideo-1.5 and LTX-2) with the platform's inductor backend, although vLLM-Omni's CPU platform
    declares no inductor support (``supports_torch_inductor``) and so compiles no transformer. On a CPU inductor
    builds C++ with the system compiler at each engine start and checks the machine's vector extensions by loading
    test libraries in fresh interpreters that import torch: seconds of CPU per start for an activation function.
    Patched: the native forward is kept uncompiled. Remove once vLLM asks the platform before compiling custom ops."""
    if "custom_op_compile" in _applied:
        return
    from vllm.model_executor.custom_op import CustomOp

    CustomOp.maybe_compile = _native_forward_uncompiled
    _applied.add("custom_op_compile")
    logger.info("verl_omni CPU patch applied: CustomOp.maybe_compile")


# ---- engine start: warm-up at the configured size, waits bounded by our setting ----------------

# The ``additional_config`` entry (vLLM's per-platform settings dict, carried into the engine's
# ``OmniDiffusionConfig``) through which an engine asks for the start below; see engine_start_config.
ENGINE_START_KEY = "verl_omni_engine_start"
# The warm-ups this process ran (the engine runs in the caller's process when it has one stage and one
# replica): what a test reads to see the size the engine really warmed up at.
_warmups_run: list[dict] = []


def engine_start_config(size: tuple[int, int] | None, timeout_s: float, timeout_key: str) -> dict:
    """The ``additional_config`` for an engine whose CPU warm-up runs at ``size`` (height, width; None:
    vLLM-Omni's own), one step, and waits up to ``timeout_s`` seconds for its output (``timeout_key``
    is the setting named when that runs out)."""
    if not timeout_s > 0:
        raise ValueError(f"{timeout_key} must be > 0 seconds, got {timeout_s}")
    height, width = (None, None) if size is None else (int(size[0]), int(size[1]))
    settings = {"height": height, "width": width, "timeout_s": float(timeout_s), "timeout_key": timeout_key}
    return {ENGINE_START_KEY: settings}


def warmups_run() -> list[dict]:
    """The warm-ups run in this process so far: size, steps and the output's shape, in order."""
    return list(_warmups_run)


def _sized_warmup_request(engine, height: int, width: int):
    """vLLM-Omni's warm-up request (its reserved request id), one step at ``height`` x ``width``."""
    import PIL.Image
    from vllm_omni.diffusion import diffusion_engine
    from vllm_omni.diffusion.request import DUMMY_DIFFUSION_REQUEST_ID, OmniDiffusionRequest
    from vllm_omni.inputs.data import OmniDiffusionSamplingParams

    model_class = engine.od_config.model_class_name
    takes_image, takes_audio = diffusion_engine.supports_multimodal_input(engine.od_config)
    prompt = {"prompt": "warm-up"}
    if takes_image:
        blank = PIL.Image.new(diffusion_engine.image_color_format(model_class), (width, height))
        prompt["multi_modal_data"] = {"image": blank}
    params = OmniDiffusionSamplingParams(
        height=height,
        width=width,
        num_inference_steps=1,
        num_frames=diffusion_engine.get_dummy_run_num_frames(model_class, takes_audio),
        # no CFG: the warm-up must not need a negative prompt or a CFG-parallel group
        guidance_scale=0.0,
        num_outputs_per_prompt=1,
        extra_args={"cfg_text_scale": 1.0, "cfg_img_scale": 1.0},
    )
    return OmniDiffusionRequest(prompt=prompt, request_id=DUMMY_DIFFUSION_REQUEST_ID, sampling_params=params)


# stock pipelines whose pre-process sizes the source image at a fixed area (``qwen_image_edit_condition_area``)
FIXED_CONDITION_AREA_PIPELINES = ("QwenImageEditPipeline", "QwenImageEditPlusPipeline")


@contextmanager
def _warmup_condition_area(model_class: str, height: int, width: int):
    """A Qwen-Image-Edit warm-up's blank source image conditioned at the warm-up's own size, not at upstream's
    1024² (on CPU that one tiny step took ~16 s of a 17-19 s engine start; now under 1 s); other models as
    they are."""
    if model_class not in FIXED_CONDITION_AREA_PIPELINES:
        yield
        return
    with qwen_image_edit_condition_area(max(height, 32) * max(width, 32)):
        yield


def _make_sized_dummy_run(original):
    def _sized_dummy_run(self):
        """The warm-up at the size and with the wait an engine's ``additional_config`` asks for (else upstream's)."""
        from vllm_omni.diffusion import diffusion_engine

        settings = (getattr(self.od_config, "additional_config", None) or {}).get(ENGINE_START_KEY)
        if settings is None:
            return original(self)
        height, width, timeout_s = settings["height"], settings["width"], settings["timeout_s"]
        # upstream keeps it module-level: the engines of one process share the longest wait any asked for
        diffusion_engine._ASYNC_OUTPUT_TIMEOUT = max(diffusion_engine._ASYNC_OUTPUT_TIMEOUT, timeout_s)
        # an audio-input model's warm-up needs upstream's dummy audio: keep its request
        sized = height is not None and not diffusion_engine.supports_multimodal_input(self.od_config)[1]
        what = f"{height}x{width}, 1 step" if sized else "vLLM-Omni's own size, 1 step"
        logger.info("vLLM-Omni engine warm-up: %s (its output waited for up to %.0f s)", what, timeout_s)
        try:
            if not sized:
                return original(self)
            request = _sized_warmup_request(self, height, width)
            if self.pre_process_func is not None:
                with _warmup_condition_area(self.od_config.model_class_name, height, width):
                    request = self.pre_process_func(request)
            output = self.add_req_and_wait_for_response(request)
        except TimeoutError as error:
            raise TimeoutError(
                f"vLLM-Omni engine start: the warm-up request ({what}) was computed but its output did not "
                f"arrive within {diffusion_engine._ASYNC_OUTPUT_TIMEOUT:.0f} s (a busy machine?); "
                f"raise {settings['timeout_key']} to wait longer"
            ) from error
        if output.error:
            raise RuntimeError(f"vLLM-Omni engine warm-up ({what}) failed: {output.error}")
        shape = getattr(output.output, "shape", None)
        _warmups_run.append(
            {"height": height, "width": width, "num_inference_steps": 1, "output_shape": tuple(shape or ())}
        )

    return _sized_dummy_run


def patch_engine_warmup() -> None:
    """Gap: vLLM-Omni 0.26 ``DiffusionEngine._dummy_run`` warms the engine up at a fixed 512x512 (on CPU a
    forward far larger than the tiny rollout's, for nothing the rollout uses) and waits for the warm-up's output on the private, fixed
    ``_ASYNC_OUTPUT_TIMEOUT`` (30 s), which a busy machine overruns ("Orchestrator initialization failed").
    Patched: an engine that carries :func:`engine_start_config` warms up at that size, one step (a
    Qwen-Image-Edit source image conditioned at that size too: :func:`_warmup_condition_area`), and waits
    as long as it asks (the same module value bounds each request's output wait afterwards). Remove once
    vLLM-Omni takes the warm-up size and the output wait from its config."""
    if "engine_warmup" in _applied:
        return
    from vllm_omni.diffusion.diffusion_engine import DiffusionEngine

    DiffusionEngine._dummy_run = _make_sized_dummy_run(DiffusionEngine._dummy_run)
    _applied.add("engine_warmup")
    logger.info("verl_omni CPU patch applied: DiffusionEngine._dummy_run")


def patch_output_ready_wait() -> None:
    """Gap: vLLM-Omni 0.26 ``DiffusionEngine.step_streaming`` waits a fixed 30 s
    (``diffusion_engine._ASYNC_OUTPUT_TIMEOUT``) for the worker's output thread to pack a finished request's output,
    then fails the request with an empty error. On a loaded 2-core CPU machine that packing thread shares the cores
    with other engines and trainer processes and has taken longer (the two-replica trainer test failed so); the
    wait becomes at least :data:`OUTPUT_READY_TIMEOUT_S` (an engine's longer warm-up wait, set first, is kept)."""
    if "output_ready_wait" in _applied:
        return
    from vllm_omni.diffusion import diffusion_engine

    # never shorter than a wait an engine's warm-up already asked for (the module value is shared)
    diffusion_engine._ASYNC_OUTPUT_TIMEOUT = max(diffusion_engine._ASYNC_OUTPUT_TIMEOUT, OUTPUT_READY_TIMEOUT_S)
    _applied.add("output_ready_wait")
    logger.info("verl_omni CPU patch applied: DiffusionEngine output-ready wait %.0f s", OUTPUT_READY_TIMEOUT_S)


def patch_forked_workers() -> None:
    """Gap: vLLM-Omni 0.26 ``MultiprocDiffusionExecutor._launch_workers`` forces the ``spawn`` start method, so each
    diffusion worker re-imports torch, vLLM, vLLM-Omni and diffusers (about 34 CPU-seconds per engine start, a
    quarter of the CPU suite's CPU: docs/development.md, "Keeping the suite fast"). Spawn is what CUDA needs; on CPU
    a fork of the engine's process, which has imported all of it already, starts in a fraction of that. Patched: the executor
    module's ``multiprocessing`` is :class:`~verl_omni.platforms.forked_workers.ForkedWorkerStart`. Remove once
    vLLM-Omni lets a platform choose its workers' start method."""
    if "forked_workers" in _applied:
        return
    from vllm_omni.diffusion.executor import multiproc_executor

    from verl_omni.platforms.forked_workers import ForkedWorkerStart

    multiproc_executor.mp = ForkedWorkerStart()
    _applied.add("forked_workers")
    logger.info("verl_omni CPU patch applied: diffusion workers forked")


PATCHES = {
    "async_output_loop": patch_async_output_loop,
    "output_ready_wait": patch_output_ready_wait,
    "batch_output_split": patch_batch_output_split,
    "sdpa_dispatch": patch_sdpa_dispatch,
    "custom_op_compile": patch_custom_op_compile,
    "engine_warmup": patch_engine_warmup,
    "forked_workers": patch_forked_workers,
}


def apply_all(installed_version: str | None = None) -> list[str]:
    """Apply every CPU patch once per process (idempotent); returns the names applied so far."""
    if not _version_supported(installed_version):
        return sorted(_applied)
    for patch in PATCHES.values():
        patch()
    return sorted(_applied)

"""The only place where verl_omni patches private vLLM-Omni internals for CPU.

Each patch names the upstream gap it fills, checks the vLLM-Omni version it was written
for, is idempotent, and is applied only when our CPU platform is active
(:func:`verl_omni.platforms.omni_general_plugin`). Remove a patch once vLLM-Omni ships a
CPU platform with the same behaviour.
"""

import concurrent.futures
import logging
import threading
import time
from importlib.metadata import version

logger = logging.getLogger(__name__)

PATCHED_VLLM_OMNI_VERSIONS = ("0.26.",)
_applied: set[str] = set()
BATCH_OUTPUT_TIMEOUT_S = 60.0


def _version_supported() -> bool:
    installed = version("vllm-omni")
    if installed.startswith(PATCHED_VLLM_OMNI_VERSIONS):
        return True
    logger.warning(
        "verl_omni CPU patches were written for vllm-omni %s, found %s: not applied",
        PATCHED_VLLM_OMNI_VERSIONS,
        installed,
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


# seconds the engine waits for one output on CPU (vLLM-Omni's hard-coded 30 s, meant for accelerators)
CPU_OUTPUT_TIMEOUT_S = 600.0


def patch_output_timeout() -> None:
    """Gap: vLLM-Omni 0.26 waits at most ``_ASYNC_OUTPUT_TIMEOUT`` = 30 s for an engine output, the start-up
    warm-up (512², one step) included; on a loaded 2-core CPU the tiny SD3.5's warm-up takes longer and the
    engine fails to start. Raise the bound on CPU only."""
    if "output_timeout" in _applied:
        return
    from vllm_omni.diffusion import diffusion_engine

    diffusion_engine._ASYNC_OUTPUT_TIMEOUT = max(diffusion_engine._ASYNC_OUTPUT_TIMEOUT, CPU_OUTPUT_TIMEOUT_S)
    _applied.add("output_timeout")
    logger.info("verl_omni CPU patch applied: diffusion_engine._ASYNC_OUTPUT_TIMEOUT")


def apply_all() -> None:
    """Apply every CPU patch once per process (idempotent)."""
    if not _version_supported():
        return
    patch_async_output_loop()
    patch_batch_output_split()
    patch_sdpa_dispatch()
    patch_output_timeout()

"""The only place where verl_omni patches private vLLM-Omni internals for CPU.

Each patch names the upstream gap it fills, checks the vLLM-Omni version it was written
for, is idempotent, and is applied only when our CPU platform is active
(:func:`verl_omni.platforms.omni_general_plugin`). Remove a patch once vLLM-Omni ships a
CPU platform with the same behaviour.
"""

import logging
from importlib.metadata import version

logger = logging.getLogger(__name__)

PATCHED_VLLM_OMNI_VERSIONS = ("0.26.",)
_applied: set[str] = set()


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
                kind=AsyncOutputKind.OUTPUT_READY,
                async_output_id=async_output_id,
                error="CPU output packing failed",
            )
        self.result_mq.enqueue(reply)


def patch_async_output_loop() -> None:
    """Gap: vLLM-Omni 0.26 ``WorkerProc._async_output_loop`` builds a ``torch.Stream`` on
    ``torch.accelerator.current_accelerator()`` (``cuda`` on a CUDA-build torch without a GPU,
    ``None`` on a CPU build) and waits on device events; on CPU there is no stream to overlap
    the copy with, so the loop packs the output directly."""
    if "async_output_loop" in _applied:
        return
    from vllm_omni.diffusion.worker.diffusion_worker import WorkerProc

    WorkerProc._async_output_loop = _cpu_async_output_loop
    _applied.add("async_output_loop")
    logger.info("verl_omni CPU patch applied: WorkerProc._async_output_loop")


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


def apply_all() -> None:
    """Apply every CPU patch once per process (idempotent)."""
    if not _version_supported():
        return
    patch_async_output_loop()
    patch_sdpa_dispatch()

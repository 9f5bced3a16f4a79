"""CPU platform plugins for vLLM and vLLM-Omni.

vLLM-Omni 0.26 has no CPU platform and vLLM falls back to its ``UnspecifiedPlatform`` on a
CUDA-build torch without a GPU. These plugins let the real engines run a tiny model on CPU
(tests, the default local run). They are discovered through entry points (declared in
``pyproject.toml``), so they also load in the engine's worker processes (spawned on a GPU).

Selection: ``VERL_OMNI_CPU_PLATFORM=1`` forces the CPU platforms, ``=0`` disables them, unset
(the default) enables them only when no accelerator is detected, so a GPU machine is
unaffected by them. The general plugin also installs, on every device, the engine hook that passes
our rollouts' final pixels through the post-process (:func:`omni_general_plugin`).
"""

import logging
import os

logger = logging.getLogger(__name__)

CPU_PLATFORM_ENV = "VERL_OMNI_CPU_PLATFORM"

VLLM_CPU_PLATFORM = "verl_omni.platforms.vllm_cpu.VerlOmniCpuPlatform"
OMNI_CPU_PLATFORM = "verl_omni.platforms.omni_cpu.VerlOmniCpuOmniPlatform"

# vLLM's own probes for accelerators; "cpu" only fires for a CPU build of vLLM.
_ACCELERATOR_PROBES = ("cuda", "rocm", "xpu", "tpu")


def _accelerator_present() -> bool:
    """Ask vLLM's built-in platform probes whether any accelerator is visible."""
    from vllm.platforms import builtin_platform_plugins

    for name in _ACCELERATOR_PROBES:
        probe = builtin_platform_plugins.get(name)
        if probe is not None and probe() is not None:
            return True
    return False


def cpu_platform_enabled() -> bool:
    """Whether our CPU platforms should be active in this process (see module docstring)."""
    value = os.environ.get(CPU_PLATFORM_ENV, "").strip().lower()
    if value in ("1", "true", "yes"):
        return True
    if value in ("0", "false", "no"):
        return False
    if value:
        raise ValueError(f"{CPU_PLATFORM_ENV} must be 1, 0 or unset (auto), got {value!r}")
    return not _accelerator_present()


def vllm_platform_plugin() -> str | None:
    """Entry point of group ``vllm.platform_plugins``: our CPU platform or None.

    vLLM loads it early in every process that uses vLLM (engine workers included), so it is also
    where those processes drop the third-party noise (:mod:`verl_omni.utils.console`)."""
    from verl_omni.utils.console import quiet_third_party_output

    enabled = cpu_platform_enabled()
    quiet_third_party_output(cpu_platform=enabled)
    if enabled:
        _skip_humming_background_builds()
    return VLLM_CPU_PLATFORM if enabled else None


# humming-kernels 0.1 (vLLM's quantized-GEMM package, imported by vLLM's quantization utilities in every
# vLLM process) starts two Python processes at import that build its CUDA launcher and NVRTC binary; without
# CUDA both fail after ~4 CPU-seconds each, in every engine worker, server and agent-loop process. Nothing on
# the CPU platform uses those kernels. Its own switch turns the background builds off (a build then happens
# on first use only); remove this once humming builds lazily.
HUMMING_BACKGROUND_BUILD_SWITCH = "HUMMING_DISABLE_PARALLEL_BUILD"


def _skip_humming_background_builds() -> None:
    """Turn humming's import-time background builds off in this process and the ones it starts (a value
    the user set is kept)."""
    os.environ.setdefault(HUMMING_BACKGROUND_BUILD_SWITCH, "1")


def omni_platform_plugin() -> str | None:
    """Entry point of group ``vllm_omni.platform_plugins``: our CPU OmniPlatform or None (and, as
    :func:`vllm_platform_plugin`, the third-party noise filters of this process)."""
    from verl_omni.utils.console import quiet_third_party_output

    enabled = cpu_platform_enabled()
    quiet_third_party_output(cpu_platform=enabled)
    return OMNI_CPU_PLATFORM if enabled else None


def omni_general_plugin() -> None:
    """Entry point of group ``vllm_omni.general_plugins``: on every device the engine passes our rollouts' final
    pixels through its post-process (:func:`~verl_omni.utils.vllm_omni_compat.patch_final_pixels_postprocess`)
    and hands each finished request's output to its waiter
    (:func:`~verl_omni.utils.vllm_omni_compat.patch_async_output_handover`); on CPU, the CPU runtime patches
    (:mod:`verl_omni.platforms.cpu_patches`)."""
    from verl_omni.utils.vllm_omni_compat import patch_async_output_handover, patch_final_pixels_postprocess

    patch_final_pixels_postprocess()
    patch_async_output_handover()
    if cpu_platform_enabled():
        from verl_omni.platforms import cpu_patches

        cpu_patches.apply_all()

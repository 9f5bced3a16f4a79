"""vLLM platform for running vLLM-Omni's diffusion engine on CPU (fp32, gloo, SDPA).

Built on vLLM's ``UnspecifiedPlatform`` (what vLLM picks on a CUDA-build torch with no GPU)
rather than vLLM's ``CpuPlatform``, which expects vLLM's CPU build and its compiled CPU ops.
"""

import logging

import psutil
import torch
from vllm.platforms.interface import PlatformEnum, UnspecifiedPlatform

logger = logging.getLogger(__name__)


class CpuMemoryMixin:
    """Device hooks answered from the host: memory from psutil, no-op device control."""

    device_name = "cpu"
    device_type = "cpu"
    dispatch_key = "CPU"
    dist_backend = "gloo"
    ray_device_key = "CPU"
    device_control_env_var = "VERL_OMNI_CPU_VISIBLE_DEVICES"
    supported_quantization: list[str] = []

    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        return [torch.float32]

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return "cpu"

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return psutil.virtual_memory().total

    @classmethod
    def get_free_memory(cls, device: torch.device | None = None) -> int:
        return psutil.virtual_memory().available

    @classmethod
    def get_device_memory(cls, device: torch.device | None = None) -> tuple[int, int]:
        memory = psutil.virtual_memory()
        return memory.available, memory.total

    @classmethod
    def mem_get_info(cls, device: torch.device | None = None) -> tuple[int, int]:
        return cls.get_device_memory(device)

    @classmethod
    def get_current_memory_usage(cls, device: torch.types.Device | None = None) -> float:
        return float(psutil.Process().memory_info().rss)

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return False

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        """No device to select on CPU."""

    @classmethod
    def synchronize(cls) -> None:
        """CPU ops are synchronous."""

    @classmethod
    def empty_cache(cls) -> None:
        """The host allocator has no cache to release."""

    @classmethod
    def reset_peak_memory_stats(cls, device: torch.device | None = None) -> None:
        """No peak statistics are kept on CPU."""

    @classmethod
    def max_memory_allocated(cls, device: torch.device | None = None) -> int:
        return int(psutil.Process().memory_info().rss)

    @classmethod
    def max_memory_reserved(cls, device: torch.device | None = None) -> int:
        return int(psutil.Process().memory_info().rss)

    @classmethod
    def get_device_count(cls) -> int:
        return 1

    @classmethod
    def is_sleep_mode_available(cls) -> bool:
        return False

    @classmethod
    def supports_fp8(cls) -> bool:
        return False

    @classmethod
    def import_kernels(cls) -> None:
        """vLLM's compiled kernels are device kernels: nothing on CPU uses them, so none is imported
        (the base class tries ``vllm._C`` and warns in every process that it is missing)."""

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return "vllm.distributed.device_communicators.cpu_communicator.CpuCommunicator"


class VerlOmniCpuPlatform(CpuMemoryMixin, UnspecifiedPlatform):
    """vLLM's ``UnspecifiedPlatform`` plus the host-memory and device hooks above."""

    _enum = PlatformEnum.UNSPECIFIED

    @classmethod
    def get_torch_device(cls, local_rank: int | None = None) -> torch.device:
        return torch.device("cpu")

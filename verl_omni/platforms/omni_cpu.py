"""vLLM-Omni platform for CPU: the diffusion engine on the host, fp32, torch SDPA, gloo."""

import logging
import os
from typing import Any

import torch
from vllm.platforms.interface import PlatformEnum
from vllm_omni.platforms.interface import OmniPlatform, OmniPlatformEnum

from verl_omni.platforms.vllm_cpu import CpuMemoryMixin

logger = logging.getLogger(__name__)

_SDPA_BACKEND = "vllm_omni.diffusion.attention.backends.sdpa.SDPABackend"


class VerlOmniCpuOmniPlatform(CpuMemoryMixin, OmniPlatform):
    """OmniPlatform hooks for CPU; the host hooks are shared with our vLLM CPU platform."""

    _omni_enum = OmniPlatformEnum.OOT
    # As seen by vLLM code: the same "no accelerator" platform as our vLLM CPU platform.
    _enum = PlatformEnum.UNSPECIFIED

    @classmethod
    def get_default_stage_config_path(cls) -> str:
        # Same deploy-config tree the CUDA platform uses; stage configs are device-neutral.
        return "vllm_omni/deploy"

    @classmethod
    def get_diffusion_attn_backend_cls(
        cls, selected_backend: str | None, head_size: int, allow_trtllm_default: bool = False
    ) -> str:
        if selected_backend is not None and selected_backend.upper() != "TORCH_SDPA":
            logger.warning("Diffusion attention backend %s is not available on CPU; using TORCH_SDPA", selected_backend)
        return _SDPA_BACKEND

    @classmethod
    def supports_torch_inductor(cls) -> bool:
        return False

    @classmethod
    def get_torch_device(cls, local_rank: int | None = None) -> torch.device:
        return torch.device("cpu")

    @classmethod
    def get_device_count(cls) -> int:
        """A CPU "device" of a diffusion stage is one engine worker process on the host: vLLM-Omni starts one per
        device of its parallel layout and refuses a layout (e.g. ``ulysses_degree=2``) larger than this count, so
        a stage may have a worker per core. vLLM's own CPU platform keeps one (the mixin's)."""
        return os.cpu_count() or 1

    @classmethod
    def get_device_version(cls) -> str | None:
        return None

    @classmethod
    def record_device_event(cls) -> Any:
        """CPU work is finished when the call returns: nothing to wait for."""
        return None

    @classmethod
    def supports_cpu_offload(cls) -> bool:
        return False

    @classmethod
    def create_autocast_context(cls, *, device_type: str, dtype: torch.dtype, enabled: bool = True):
        # fp32 on CPU: never autocast to a lower precision.
        return super().create_autocast_context(device_type=device_type, dtype=dtype, enabled=False)

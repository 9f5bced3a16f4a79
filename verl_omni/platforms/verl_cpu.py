"""A CPU platform for verl, so that verl's FSDP helpers and engines run on a machine without a GPU.

verl 0.9.1 knows CUDA, NPU and ROCm only; with none present it falls back to ``nvidia`` and its
helpers call into ``torch.cuda``. This module registers ``cpu`` in verl's ``PlatformRegistry``
(imported by :mod:`verl_omni.plugin` through the ``verl.plugins`` entry point, so Ray workers get
it too). verl probes its built-in platforms first, so a machine with a CUDA device never selects
this one; ``VERL_PLATFORM=cpu`` forces it. The gaps it fills (docs/design.md, "verl on the CPU"):

* ``current_device()`` returns ``"cpu"``: verl passes it to ``tensor.to(...)``, where the
  integer 0 would mean ``cuda:0``;
* ``torch.cpu`` lacks ``empty_cache`` / ``mem_get_info`` / ``memory_allocated``: the device
  module is ``torch.cpu`` plus those, answered from the host (no-op, psutil, 0);
* the communication backend is ``gloo``. (verl's ``initialize_global_process_group_ray``
  builds ``"cpu:gloo,<device>:<backend>"``, a duplicate key on CPU: callers on this platform
  pass ``backend="gloo"`` explicitly.)
"""

from __future__ import annotations

import logging
import shutil
import types
from contextlib import contextmanager
from typing import Any

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

logger = logging.getLogger(__name__)

PLATFORM_NAME = "cpu"


def _host_mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes of host memory, the CPU analogue of ``torch.cuda.mem_get_info``."""
    import psutil

    mem = psutil.virtual_memory()
    return mem.available, mem.total


def _zero(*_args, **_kwargs) -> int:
    return 0


def _noop(*_args, **_kwargs) -> None:
    return None


def _build_device_module() -> types.ModuleType:
    """``torch.cpu`` with the memory/RNG entry points verl expects of a device module."""
    module = types.ModuleType("verl_omni_cpu_device")
    fills = {
        "empty_cache": _noop,
        "mem_get_info": _host_mem_get_info,
        "memory_allocated": _zero,
        "memory_reserved": _zero,
        "max_memory_allocated": _zero,
        "max_memory_reserved": _zero,
        "reset_peak_memory_stats": _noop,
        "current_device": lambda: "cpu",
        "set_device": _noop,
        "manual_seed": torch.manual_seed,
        "manual_seed_all": torch.manual_seed,
        "get_rng_state": torch.get_rng_state,
        "set_rng_state": torch.set_rng_state,
        "is_available": lambda: True,
    }
    for name in dir(torch.cpu):
        if not name.startswith("__"):
            setattr(module, name, getattr(torch.cpu, name))
    for name, fn in fills.items():
        setattr(module, name, fn)
    return module


def cuda_device_present() -> bool:
    """A CUDA device is usable here, or an NVIDIA driver is installed (CPU-only actor on a GPU node)."""
    return torch.cuda.is_available() or shutil.which("nvidia-smi") is not None


@PlatformRegistry.register(platform=PLATFORM_NAME)
class PlatformCPU(PlatformBase):
    """verl platform for hosts without an accelerator: gloo collectives, fp32, host memory."""

    _device_module = _build_device_module()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return self._device_module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check=False) -> bool:
        return not cuda_device_present()

    def current_device(self) -> str:
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "CPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_cpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None

"""Third-party console output that says nothing to a verl_omni user, filtered where it is emitted.

A run prints its first line after the imports of Ray, verl, vLLM, vLLM-Omni, torch, transformers and
diffusers, each with warnings about optional backends this project never uses. The filters below
drop those, and only those, by their exact origin (warning category, message and module; logger
name and message); anything else, including every warning that asks the user to do something,
still prints. ``VERL_OMNI_SHOW_WARNINGS=1`` turns the filters off in every process.

:func:`quiet_third_party_output` is idempotent and runs in each kind of process before the noise:
the trainer entry (``main_flowgrpo``, before it imports verl), every Ray worker (``init_ray``'s
``worker_process_setup_hook``) and every vLLM process (our vLLM platform plugin entry point, which
vLLM loads before it imports its kernels). The environment variable is read, not a config key,
because the noise comes from imports that run before the config is composed.
"""

from __future__ import annotations

import logging
import os
import re
import warnings

SHOW_WARNINGS_ENV = "VERL_OMNI_SHOW_WARNINGS"

# Python warnings: (category, message regex from its start, module regex of the warn() caller)
QUIET_WARNINGS: tuple[tuple[type[Warning], str, str], ...] = (
    # verl probes its optional training engines at import; we run on our own diffusers FSDP engine
    (
        UserWarning,
        r"(torchtitan|veomni|automodel|mindspeed|megatron) engine is not available",
        r"verl\.workers\.engine",
    ),
)

# log records: (logger name, message regex from its start)
QUIET_LOG_RECORDS: tuple[tuple[str, str], ...] = (
    # vLLM lists every plugin it finds in every process; "Platform plugin ... is activated" still prints
    ("vllm.plugins", r"Available plugins for group |- \S+ -> \S+$|All plugins in this group will be loaded"),
    # our worker extension overrides init_lora_manager on purpose (in-memory LoRA tensors)
    (
        "vllm_omni.diffusion.worker.diffusion_worker",
        r"Worker class .* already has attribute init_lora_manager, .*verl_omni\.workers\.rollout",
    ),
)

# noise only on our CPU platform (on a GPU machine the same lines would point at a real problem)
QUIET_CPU_WARNINGS: tuple[tuple[type[Warning], str, str], ...] = ()
QUIET_CPU_LOG_RECORDS: tuple[tuple[str, str], ...] = (
    ("vllm.triton_utils.importing", r"Triton is installed but 0 active driver"),
    ("torch.utils.cpp_extension", r"No CUDA runtime is found"),
    ("vllm_omni.worker.gpu_memory_utils", r"NVML init failed"),
    # fp32 on CPU always runs torch SDPA (the platform selects it too)
    ("vllm_omni.diffusion.attention.layer", r"Only SDPA supports float32\. Overriding user config"),
    (
        "vllm_omni.diffusion.worker.diffusion_model_runner",
        r"Model runner: Platform cpu does not support torch inductor",
    ),
)

_installed: set[str] = set()


class _DropMessages(logging.Filter):
    """Drops a logger's records whose message starts with one of the given patterns."""

    def __init__(self, patterns: list[str]):
        super().__init__()
        self.pattern = re.compile("|".join(f"(?:{p})" for p in patterns))

    def filter(self, record: logging.LogRecord) -> bool:
        return self.pattern.match(record.getMessage()) is None


def warnings_shown() -> bool:
    """Whether the user asked for every third-party warning (``VERL_OMNI_SHOW_WARNINGS=1``)."""
    value = os.environ.get(SHOW_WARNINGS_ENV, "").strip().lower()
    if value in ("", "0", "false", "no"):
        return False
    if value in ("1", "true", "yes"):
        return True
    raise ValueError(f"{SHOW_WARNINGS_ENV} must be 1 or 0, got {value!r}")


def _install(name: str, python_warnings, log_records) -> None:
    if name in _installed:
        return
    for category, message, module in python_warnings:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    by_logger: dict[str, list[str]] = {}
    for logger_name, message in log_records:
        by_logger.setdefault(logger_name, []).append(message)
    for logger_name, patterns in by_logger.items():
        logging.getLogger(logger_name).addFilter(_DropMessages(patterns))
    _installed.add(name)


def quiet_third_party_output(cpu_platform: bool = False) -> bool:
    """Install the filters in this process (once; ``cpu_platform`` adds the CPU platform's); returns
    whether they are active (not with ``VERL_OMNI_SHOW_WARNINGS=1``)."""
    if warnings_shown():
        return False
    _install("general", QUIET_WARNINGS, QUIET_LOG_RECORDS)
    if cpu_platform:
        _install("cpu", QUIET_CPU_WARNINGS, QUIET_CPU_LOG_RECORDS)
    return True

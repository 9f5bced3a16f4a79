"""Tiny random models that the project builds itself (tests, CI, the default CPU run).

Nothing can be downloaded at run time, so every model a test or the default run needs is built
here from a config with random weights and a tokenizer trained offline. Each builder writes a
directory in the layout of the real checkpoint, so the same loading code serves both.

CLI: ``python -m verl_omni.utils.tiny_models NAME --out DIR [--seed S]``.
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Callable
from pathlib import Path

# name -> "module:function"; each is ``build(out_dir: Path, seed: int, dtype: str = "float32") -> Path``.
# Lazy strings keep ``import verl_omni.utils.tiny_models`` free of torch/transformers imports.
_BUILDERS: dict[str, str] = {
    "qwen_image": "verl_omni.utils.tiny_models.qwen_image:build_tiny_qwen_image",
    "bagel": "verl_omni.utils.tiny_models.bagel:build_tiny_bagel",
    "clip": "verl_omni.utils.tiny_models.clip:build_tiny_clip",
    "sd3": "verl_omni.utils.tiny_models.sd3:build_tiny_sd3",
    "flux": "verl_omni.utils.tiny_models.flux:build_tiny_flux",
    "z_image": "verl_omni.utils.tiny_models.z_image:build_tiny_z_image",
}


def available_builders() -> list[str]:
    return sorted(_BUILDERS)


def get_builder(name: str) -> Callable[..., Path]:
    """Return the builder registered under ``name``; unknown names list the choices."""
    if name not in _BUILDERS:
        raise ValueError(f"Unknown tiny model {name!r}. Available: {', '.join(available_builders())}.")
    module, func = _BUILDERS[name].split(":")
    return getattr(importlib.import_module(module), func)


def build_tiny_model(name: str, out_dir: str | Path, seed: int = 0, dtype: str = "float32") -> Path:
    """Build the tiny model ``name`` into ``out_dir`` (created), weights saved in ``dtype``; return the directory."""
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"dtype must be float32, bfloat16 or float16, got {dtype!r}")
    return get_builder(name)(Path(out_dir), seed, dtype)


def directory_digest(path: str | Path) -> str:
    """sha256 over every file's relative path and bytes: equal digests mean byte-identical model directories."""
    root = Path(path)
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(f.relative_to(root).as_posix().encode())
        h.update(f.read_bytes())
    return h.hexdigest()

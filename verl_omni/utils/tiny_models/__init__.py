"""Tiny random models that the project builds itself (tests, CI, the default CPU run).

Nothing can be downloaded at run time, so every model a test or the default run needs is built
here from a config with random weights and a tokenizer trained offline. Each builder writes a
directory in the layout of the real checkpoint, so the same loading code serves both.

CLI: ``python -m verl_omni.utils.tiny_models NAME --out DIR [--seed S]``.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.metadata
import importlib.util
import pkgutil
from collections.abc import Callable
from pathlib import Path

# Built-in builders, found without a list: the module ``verl_omni/utils/tiny_models/<name>.py`` that
# defines a top-level ``build_tiny_<name>(out_dir: Path, seed: int = 0, dtype: str = "float32") -> Path``
# is the builder of ``<name>``. Modules without one (``tokenizer``) are shared helpers. Names are read
# from the source (an ``ast`` parse), not by importing it: ``import verl_omni.utils.tiny_models`` and
# listing the names stay free of torch/transformers imports; a builder's module loads when it is used.
BUILDER_PREFIX = "build_tiny_"
# Other packages add builders through this entry-point group: ``<name> = "<module>:<function>"``.
TINY_MODEL_ENTRY_POINT_GROUP = "verl_omni.tiny_models"


def _defines_builder(module: str, name: str) -> bool:
    """Whether ``module``'s source defines a top-level ``build_tiny_<name>`` function (read, not imported)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return False
    tree = ast.parse(Path(spec.origin).read_text(), filename=spec.origin)
    return any(isinstance(node, ast.FunctionDef) and node.name == BUILDER_PREFIX + name for node in tree.body)


def _builtin_builders() -> list[str]:
    return [
        info.name
        for info in pkgutil.iter_modules(__path__)
        if not info.ispkg and not info.name.startswith("_") and _defines_builder(f"{__name__}.{info.name}", info.name)
    ]


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=TINY_MODEL_ENTRY_POINT_GROUP)}


def available_builders() -> list[str]:
    """Built-in builder names and those of installed ``verl_omni.tiny_models`` entry points (nothing imported)."""
    return sorted(set(_builtin_builders()) | set(_entry_points()))


def get_builder(name: str) -> Callable[..., Path]:
    """Return the builder of ``name`` (imported now); unknown names list the choices and how to add one."""
    builtin = name in _builtin_builders()
    ep = _entry_points().get(name)
    if builtin and ep is not None:
        raise ValueError(
            f"tiny model {name!r} is built in and also declared by an installed entry point {ep.value!r} "
            f"(group {TINY_MODEL_ENTRY_POINT_GROUP!r}): rename the entry point"
        )
    if builtin:
        return getattr(importlib.import_module(f"{__name__}.{name}"), BUILDER_PREFIX + name)
    if ep is not None:
        builder = ep.load()
        if not callable(builder):
            raise TypeError(f"entry point {ep.value!r} of tiny model {name!r} is not a builder function: {builder!r}")
        return builder
    raise ValueError(
        f"Unknown tiny model {name!r}. Available: {', '.join(available_builders())}. Add one as a module "
        f"verl_omni/utils/tiny_models/<name>.py defining {BUILDER_PREFIX}<name>(out_dir, seed=0, dtype='float32'), "
        f"or install a package declaring an entry point in group {TINY_MODEL_ENTRY_POINT_GROUP!r}: "
        "'<name> = \"<module>:<function>\"' (docs/models.md)."
    )


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

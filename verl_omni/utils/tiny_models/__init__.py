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
import pkgutil
from collections.abc import Callable
from pathlib import Path

# Built-in builders, found without a list, in two places:
# * a model package's ``verl_omni/pipelines/<model>/tiny_model.py`` that defines a top-level
#   ``build_tiny_<model>(out_dir: Path, seed: int = 0, dtype: str = "float32") -> Path`` is the builder of
#   ``<model>`` (a model's tiny builder lives with its adapter: adding a model touches no file here);
# * a module ``verl_omni/utils/tiny_models/<name>.py`` defining ``build_tiny_<name>`` (models that are no
#   adapter package, e.g. the reward scorers' ``clip``). Modules without one (``tokenizer``, ``components``)
#   are shared helpers.
# Names are read from the source (an ``ast`` parse), not by importing it: ``import verl_omni.utils.tiny_models``
# and listing the names stay free of torch/transformers imports; a builder's module loads when it is used.
BUILDER_PREFIX = "build_tiny_"
# the module of a model package that holds its tiny builder
MODEL_PACKAGE_MODULE = "tiny_model"
PIPELINES_DIR = Path(__file__).resolve().parents[2] / "pipelines"
# Other packages add builders through this entry-point group: ``<name> = "<module>:<function>"``.
TINY_MODEL_ENTRY_POINT_GROUP = "verl_omni.tiny_models"


def _defines_builder(path: Path, name: str) -> bool:
    """Whether the source file ``path`` defines a top-level ``build_tiny_<name>`` function (read, not imported)."""
    if not path.is_file():
        return False
    tree = ast.parse(path.read_text(), filename=str(path))
    return any(isinstance(node, ast.FunctionDef) and node.name == BUILDER_PREFIX + name for node in tree.body)


def _builtin_builders() -> dict[str, str]:
    """Built-in builder name -> the module that defines it."""
    found = {}
    for info in pkgutil.iter_modules(__path__):
        if not info.ispkg and not info.name.startswith("_"):
            if _defines_builder(Path(__path__[0]) / f"{info.name}.py", info.name):
                found[info.name] = f"{__name__}.{info.name}"
    for package in sorted(p for p in PIPELINES_DIR.iterdir() if p.is_dir()):
        if _defines_builder(package / f"{MODEL_PACKAGE_MODULE}.py", package.name):
            if package.name in found:
                raise RuntimeError(
                    f"tiny model {package.name!r} is built by both {found[package.name]} and "
                    f"verl_omni.pipelines.{package.name}.{MODEL_PACKAGE_MODULE}: keep one"
                )
            found[package.name] = f"verl_omni.pipelines.{package.name}.{MODEL_PACKAGE_MODULE}"
    return found


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=TINY_MODEL_ENTRY_POINT_GROUP)}


def available_builders() -> list[str]:
    """Built-in builder names and those of installed ``verl_omni.tiny_models`` entry points (nothing imported)."""
    return sorted(set(_builtin_builders()) | set(_entry_points()))


def get_builder(name: str) -> Callable[..., Path]:
    """Return the builder of ``name`` (imported now); unknown names list the choices and how to add one."""
    builtin = _builtin_builders().get(name)
    ep = _entry_points().get(name)
    if builtin and ep is not None:
        raise ValueError(
            f"tiny model {name!r} is built in and also declared by an installed entry point {ep.value!r} "
            f"(group {TINY_MODEL_ENTRY_POINT_GROUP!r}): rename the entry point"
        )
    if builtin:
        return getattr(importlib.import_module(builtin), BUILDER_PREFIX + name)
    if ep is not None:
        builder = ep.load()
        if not callable(builder):
            raise TypeError(f"entry point {ep.value!r} of tiny model {name!r} is not a builder function: {builder!r}")
        return builder
    raise ValueError(
        f"Unknown tiny model {name!r}. Available: {', '.join(available_builders())}. Add one as a module "
        f"verl_omni/pipelines/<name>/{MODEL_PACKAGE_MODULE}.py defining {BUILDER_PREFIX}<name>(out_dir, seed=0, "
        "dtype='float32'), "
        f"or install a package declaring an entry point in group {TINY_MODEL_ENTRY_POINT_GROUP!r}: "
        "'<name> = \"<module>:<function>\"' (docs/extending/model.md)."
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

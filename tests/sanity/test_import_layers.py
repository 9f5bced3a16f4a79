"""Layers only point down: every module of ``verl_omni`` imports modules of its own layer or of a lower one.

Static: each source file is parsed (nothing is imported), and every import counts, the ones inside functions and
under ``TYPE_CHECKING`` too, so that a lazy import cannot hide a cycle. The layers, lowest first:

* ``utils``: shared helpers (the package root too); ``utils.vllm_omni_compat``, the vLLM-Omni gaps worked around on
  every device, imports nothing of ours at all.
* ``platforms``: the CPU platforms and their patches of vLLM-Omni; they load in every vLLM process through entry
  points, before anything else of ours, so they may use ``utils`` and the upstream stack only.
* ``pipelines``: model adapters, rollout pipelines, the recorder and the sampling spec (the record names).
* ``algorithms``: the algorithm contract and one module per algorithm.
* ``workers``: the actor, the engine, the rollout server and engine, weight sync.
* ``agent_loop`` and ``reward_loop``: siblings, neither imports the other.
* ``trainer``: the driver, its config and entry points.
* ``plugin``: verl's entry point, which imports the modules that register with verl (any layer); nothing imports it.

A layer may import its own modules and those of lower layers; siblings may not import each other.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = "verl_omni"
PACKAGE_DIR = Path(__file__).resolve().parents[2] / PACKAGE

# lowest first; the layers of one tier are siblings
TIERS = (
    ("utils",),
    ("platforms",),
    ("pipelines",),
    ("algorithms",),
    ("workers",),
    ("agent_loop", "reward_loop"),
    ("trainer",),
    ("plugin",),
)
# the package root holds no code of its own (a version string): it sits with the helpers
ROOT_LAYER = "utils"
# modules that import nothing of verl_omni, whatever their layer
SELF_CONTAINED = ("verl_omni.utils.vllm_omni_compat",)
# (importing module, imported module) -> why this one import may point up; keep it tiny
ALLOWED = {
    ("verl_omni.utils.tiny_models.wan2_2_a14b", "verl_omni.pipelines.wan2_2.tiny_model"): (
        "the tiny-model builders' command line (utils.tiny_models) builds each model package's tiny model, found "
        "by name; this named variant of Wan2.2 is built by its model package's builder, imported when it is run"
    ),
    ("verl_omni.utils.tiny_models.flux2_klein_distilled", "verl_omni.pipelines.flux2_klein.tiny_model"): (
        "as for wan2_2_a14b: the step-distilled FLUX.2-klein is built by its model package's builder"
    ),
    ("verl_omni.utils.tiny_models.wan2_2_i2v_a14b", "verl_omni.pipelines.wan2_2_i2v.tiny_model"): (
        "the I2V-A14B's tiny model under the checkpoint's name, built by its model package's builder (as above)"
    ),
    ("verl_omni.utils.tiny_models.hunyuan_video_1_5_i2v", "verl_omni.pipelines.hunyuan_video_1_5.tiny_model"): (
        "HunyuanVideo-1.5's image-to-video tiny model under its own name, built by its model package (as above)"
    ),
}

TIER_OF = {layer: tier for tier, layers in enumerate(TIERS) for layer in layers}
RULE = " < ".join(" | ".join(layers) for layers in TIERS)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str:
    """The layer of a ``verl_omni`` module: its top-level subpackage or module under the package."""
    parts = module.split(".")
    layer = parts[1] if len(parts) > 1 else ROOT_LAYER
    if layer not in TIER_OF:
        raise AssertionError(
            f"{module} is in no layer: add {layer!r} to TIERS in {Path(__file__).name} at the tier it belongs to"
        )
    return layer


@functools.cache
def imported_modules(source: str, module: str, is_package: bool) -> tuple[tuple[int, str], ...]:
    """``(line, imported module)`` of every import of ``verl_omni`` in ``source`` (relative ones resolved)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                names = [".".join(base + ([node.module] if node.module else []))]
            else:
                names = [node.module or ""]
        else:
            continue
        found += [(node.lineno, name) for name in names if name == PACKAGE or name.startswith(PACKAGE + ".")]
    return tuple(found)


def violations(source: str, module: str, where: str, is_package: bool = False) -> list[str]:
    """Each import of ``source`` (module ``module``, shown as ``where``) that breaks the layering, with the rule."""
    own = layer_of(module)
    found = []
    for line, imported in imported_modules(source, module, is_package):
        if (module, imported) in ALLOWED:
            continue
        if module in SELF_CONTAINED:
            found.append(f"{where}:{line} imports {imported}: {module} imports nothing of {PACKAGE}")
            continue
        target = layer_of(imported)
        if target == own or TIER_OF[target] < TIER_OF[own]:
            continue
        relation = "a sibling layer" if TIER_OF[target] == TIER_OF[own] else "a higher layer"
        found.append(
            f"{where}:{line} imports {imported}: layer {own!r} may not import {target!r} ({relation}; layers: {RULE})"
        )
    return found


def test_every_import_of_the_package_points_down():
    found = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        where = str(path.relative_to(PACKAGE_DIR.parent))
        found += violations(path.read_text(), module_name(path), where, is_package=path.name == "__init__.py")
    assert not found, "imports against the layers:\n" + "\n".join(found)


def test_every_allowed_exception_is_still_an_import_of_the_package():
    # an entry whose import is gone must go too, or the list grows into a second, stale map
    imports = set()
    for path in PACKAGE_DIR.rglob("*.py"):
        module = module_name(path)
        imports |= {
            (module, name) for _, name in imported_modules(path.read_text(), module, path.name == "__init__.py")
        }
    assert set(ALLOWED) <= imports, sorted(set(ALLOWED) - imports)


@pytest.mark.parametrize(
    ("module", "source", "message"),
    [
        (
            "verl_omni.workers.x",
            "def f():\n    from verl_omni.trainer.config import config\n",
            "w.py:2 imports verl_omni.trainer.config: layer 'workers' may not import 'trainer' (a higher layer",
        ),
        (
            "verl_omni.agent_loop.x",
            "from verl_omni.reward_loop import reward_manager\n",
            "layer 'agent_loop' may not import 'reward_loop' (a sibling layer",
        ),
        ("verl_omni.pipelines.sd3.x", "from ...platforms import cpu_patches\n", None),
        ("verl_omni.pipelines.sd3.x", "from ...workers import engine_workers\n", "imports verl_omni.workers"),
        (
            "verl_omni.utils.vllm_omni_compat",
            "import verl_omni.utils.registry\n",
            "imports verl_omni.utils.registry: verl_omni.utils.vllm_omni_compat imports nothing of verl_omni",
        ),
    ],
)
def test_an_upward_sibling_or_forbidden_import_is_named_with_the_rule(module, source, message):
    found = violations(source, module, "w.py")
    if message is None:
        assert found == []
    else:
        (line,) = found
        assert message in line
        assert RULE in line or "imports nothing" in line

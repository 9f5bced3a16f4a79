"""Generic modules hold no model facts: none imports a model package (``verl_omni/pipelines/<model>/``).

What differs between models is read from the checkpoint's adapter (``get_model_adapter``); a generic
module that imported one model's package would apply that model's facts to every model (as the rollout's
LoRA loader once applied Qwen-Image's renaming to all of them).
"""

import ast
from pathlib import Path

import verl_omni
from verl_omni.pipelines.model_base import ADAPTER_MODULE

ROOT = Path(verl_omni.__file__).parent
GENERIC = ("workers", "agent_loop", "trainer", "reward_loop")
# rollout-free one-step check of Qwen-Image's math (a tool for that model; issue 16 moves it onto the recorder)
MODEL_SPECIFIC_TOOLS = {"trainer/sanity_step.py"}


def _model_packages() -> set[str]:
    return {p.parent.name for p in (ROOT / "pipelines").glob(f"*/{ADAPTER_MODULE}.py")}


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    names += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [  # importlib.import_module("verl_omni.pipelines.<model>...") with a literal
        n.args[0].value
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and n.args
        and isinstance(n.args[0], ast.Constant)
        and isinstance(n.args[0].value, str)
        and getattr(n.func, "attr", getattr(n.func, "id", "")) == "import_module"
    ]
    return names


def _package_of(module: str) -> str | None:
    """``<model>`` of ``verl_omni.pipelines.<model>[.…]``, else None."""
    parts = module.split(".")
    return parts[2] if parts[:2] == ["verl_omni", "pipelines"] and len(parts) > 2 else None


def test_generic_modules_import_no_model_package():
    models = _model_packages()
    assert {"qwen_image", "bagel"} <= models
    offenders = {}
    for folder in GENERIC:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in MODEL_SPECIFIC_TOOLS:
                continue
            bad = [m for m in _imports(path) if _package_of(m) in models]
            if bad:
                offenders[rel] = bad
    assert offenders == {}, f"generic modules import model packages (read the adapter instead): {offenders}"

"""BAGEL (thinker + DiT unified model): training module, training adapter and rollout pipeline."""

import importlib.util
from pathlib import Path


def vllm_omni_deploy_config(name: str) -> str:
    """Path of one of vLLM-Omni's shipped deploy configs, e.g. ``"bagel_single_stage"`` (DiT only) or ``"bagel"``
    (thinker + DiT); found without importing vLLM-Omni."""
    spec = importlib.util.find_spec("vllm_omni")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("vllm_omni is not installed: it ships the BAGEL deploy configs")
    path = Path(spec.origin).parent / "deploy" / f"{name}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"vLLM-Omni has no deploy config {name!r} (looked for {path})")
    return str(path)

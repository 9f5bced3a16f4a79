"""Training adapters by architecture: one per diffusers pipeline class, found from ``model_index.json``.

An adapter is a class whose attributes state the facts the trainer needs about an architecture
(FSDP wrap blocks, LoRA targets, the LoRA file format's pipeline) and whose static methods load
the transformer and predict a velocity. Engines look the adapter up here and read those
attributes; nothing in the trainer tests an architecture name.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

from verl_omni.utils.registry import Registry

TRAINING_ADAPTERS: Registry = Registry("training adapter", check=inspect.isclass)

register_training_adapter = TRAINING_ADAPTERS.register


def pipeline_class_name(model_path: str | Path) -> str:
    """``_class_name`` of a diffusers checkpoint directory's ``model_index.json``."""
    index = Path(model_path) / "model_index.json"
    if not index.is_file():
        raise FileNotFoundError(f"model.path={model_path!s} has no model_index.json: it must be a diffusers directory")
    return json.loads(index.read_text())["_class_name"]


def get_training_adapter(model_path: str | Path):
    """The adapter registered for the pipeline class of the checkpoint at ``model_path``."""
    import verl_omni.pipelines.qwen_image.training_adapter  # noqa: F401  (registers the built-in adapters)

    return TRAINING_ADAPTERS.get(pipeline_class_name(model_path))

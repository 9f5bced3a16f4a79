"""Checks shared by the model-based scorers: local checkpoint files and optional dependencies.

Nothing is downloaded at run time, so a scorer's checkpoint is a local directory named in its
``params``; a missing directory or file is an error naming the config key and what belongs there.
Heavy scorer libraries are an optional extra (``pip install 'verl_omni[rewards]'``), imported on
first use, so that importing the scorer registry never needs them.
"""

from __future__ import annotations

import importlib
import logging
import os
from types import ModuleType

logger = logging.getLogger(__name__)

REWARDS_EXTRA = "pip install 'verl_omni[rewards]'"


def require_dir(path: str, key: str, what: str) -> str:
    """Return ``path`` if it is a directory, else raise naming ``key`` and ``what`` belongs there."""
    if not path:
        raise ValueError(f"{key} must name a local directory holding {what}, got ''")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{key}={path!r} is not a directory; it must hold {what}")
    return path


def require_file(directory: str, name: str, key: str, what: str) -> str:
    """Return ``directory/name`` if it is a file, else raise naming ``key`` and what to put there."""
    path = os.path.join(directory, name)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{key}={directory!r} has no {name}: put {what} there")
    return path


def import_extra(module: str, scorer: str) -> ModuleType:
    """Import ``module`` of the ``rewards`` extra; a missing one names the scorer and the install."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"scorer {scorer!r} needs the {module!r} package: {REWARDS_EXTRA}") from e

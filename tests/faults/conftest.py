"""The fault-injection suite's fixtures: the trainer tests' run builders (``tests/trainer/trainer_helpers.py``) and
their prompt files."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# the trainer tests' helpers are a module beside their tests, not a package
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trainer"))


@pytest.fixture(scope="session")
def prompt_files(tmp_path_factory):
    from trainer_helpers import write_prompt_files

    return write_prompt_files(tmp_path_factory.mktemp("prompts"))

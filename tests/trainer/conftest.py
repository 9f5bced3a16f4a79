"""Fixtures of the trainer tests: prompt files (the Ray cluster is the session's, ``tests/conftest.py``)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def prompt_files(tmp_path_factory):
    """``(train, val)`` parquet files whose prompts alternate short and long token lengths."""
    from trainer_helpers import write_prompt_files

    return write_prompt_files(tmp_path_factory.mktemp("prompts"))


@pytest.fixture(scope="session")
def edit_prompt_files(tmp_path_factory):
    """``(train, val)`` editing sets: the same prompts as instructions, each with a source image."""
    from trainer_helpers import write_edit_prompt_files

    return write_edit_prompt_files(tmp_path_factory.mktemp("edit_prompts"))

"""Fixtures of the trainer tests: prompt files (the Ray cluster is the session's, ``tests/conftest.py``)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def prompt_files(tmp_path_factory):
    """``(train, val)`` parquet files whose prompts alternate short and long token lengths."""
    from trainer_helpers import write_prompt_files

    return write_prompt_files(tmp_path_factory.mktemp("prompts"))

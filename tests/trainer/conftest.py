"""Fixtures of the trainer tests."""

import pytest


@pytest.fixture(scope="module")
def prompt_files(tmp_path_factory):
    """``(train, val)`` parquet files whose prompts alternate short and long token lengths."""
    from trainer_helpers import write_prompt_files

    return write_prompt_files(tmp_path_factory.mktemp("prompts"))

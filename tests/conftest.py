"""Session-wide fixtures: tiny random models are built once per test session.

Importing ``verl_omni`` here would register things as a side effect; fixtures import lazily.
"""

import pytest


@pytest.fixture(scope="session")
def tiny_qwen_image_path(tmp_path_factory):
    """Directory of a tiny random Qwen-Image (diffusers layout), built once per session with seed 0."""
    from verl_omni.utils.tiny_models import build_tiny_model

    return build_tiny_model("qwen_image", tmp_path_factory.mktemp("tiny_qwen_image"), seed=0)


@pytest.fixture(scope="session")
def tiny_qwen_image_bf16_path(tmp_path_factory):
    """The same tiny Qwen-Image saved in bf16, like the released checkpoint (GPU engines run it in bf16)."""
    from verl_omni.utils.tiny_models import build_tiny_model

    return build_tiny_model("qwen_image", tmp_path_factory.mktemp("tiny_qwen_image_bf16"), seed=0, dtype="bfloat16")

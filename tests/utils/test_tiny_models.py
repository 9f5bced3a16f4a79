"""The tiny random Qwen-Image: deterministic, small, loadable by diffusers, and it generates on CPU."""

import json

import pytest
import torch

from verl_omni.utils.tiny_models import available_builders, build_tiny_model, directory_digest, get_builder

TEMPLATE_PREFIX = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
    "spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n"
)
DROPPED_PREFIX_TOKENS = 34  # QwenImagePipeline.prompt_template_encode_start_idx


def test_builder_is_deterministic_per_seed_and_small(tiny_qwen_image_path, tmp_path):
    again = build_tiny_model("qwen_image", tmp_path / "same", seed=0)
    other = build_tiny_model("qwen_image", tmp_path / "other", seed=1)
    assert directory_digest(again) == directory_digest(tiny_qwen_image_path)
    assert directory_digest(other) != directory_digest(tiny_qwen_image_path)
    size = sum(f.stat().st_size for f in tiny_qwen_image_path.rglob("*") if f.is_file())
    assert size < 20 * 2**20
    index = json.loads((tiny_qwen_image_path / "model_index.json").read_text())
    assert index["_class_name"] == "QwenImagePipeline"
    assert {"transformer", "vae", "text_encoder", "tokenizer", "scheduler"} <= set(index)


def test_scheduler_config_is_qwen_images(tiny_qwen_image_path):
    cfg = json.loads((tiny_qwen_image_path / "scheduler" / "scheduler_config.json").read_text())
    assert cfg["use_dynamic_shifting"] and cfg["shift_terminal"] == 0.02 and cfg["max_shift"] == 0.9


def test_prompts_tokenize_past_the_dropped_template_prefix(tiny_qwen_image_path):
    from transformers import Qwen2Tokenizer

    tok = Qwen2Tokenizer.from_pretrained(tiny_qwen_image_path / "tokenizer")
    prefix = tok(TEMPLATE_PREFIX).input_ids
    full = tok(TEMPLATE_PREFIX + 'a red cat holding a sign that says "HELLO"<|im_end|>\n').input_ids
    assert len(prefix) >= DROPPED_PREFIX_TOKENS
    assert full[: len(prefix)] == prefix and len(full) > len(prefix) + 5
    assert tok.convert_tokens_to_ids("<|im_start|>") != tok.unk_token_id


def test_diffusers_loads_and_generates_an_image_on_cpu(tiny_qwen_image_path):
    from diffusers import QwenImagePipeline

    pipe = QwenImagePipeline.from_pretrained(tiny_qwen_image_path)
    pipe.set_progress_bar_config(disable=True)
    kwargs = {"height": 32, "width": 32, "num_inference_steps": 3, "output_type": "pt"}
    a = pipe(prompt="a red cat", generator=torch.Generator().manual_seed(0), **kwargs).images
    b = pipe(prompt="a red cat", generator=torch.Generator().manual_seed(1), **kwargs).images
    assert a.shape == (1, 3, 32, 32)
    assert torch.isfinite(a).all() and 0 <= a.min() and a.max() <= 1
    assert (a - b).abs().max() > 1e-3  # another seed, another image


def test_unknown_builder_lists_the_choices():
    assert "qwen_image" in available_builders()
    with pytest.raises(ValueError, match="Available: .*qwen_image"):
        get_builder("qwen_imag")


def test_bf16_variant_saves_bf16_weights_and_rejects_other_dtypes(tiny_qwen_image_bf16_path, tmp_path):
    from safetensors import safe_open

    f = tiny_qwen_image_bf16_path / "transformer" / "diffusion_pytorch_model.safetensors"
    with safe_open(f, "pt") as st:
        assert {st.get_tensor(k).dtype for k in st.keys()} == {torch.bfloat16}
    with pytest.raises(ValueError, match="dtype"):
        build_tiny_model("qwen_image", tmp_path, dtype="int8")


def test_each_model_package_holds_its_tiny_builder():
    """A model's tiny builder lives in its package (``pipelines/<model>/tiny_model.py``), found by reading the source."""
    from verl_omni.pipelines.model_base import ADAPTER_MODULE
    from verl_omni.utils import tiny_models

    packages = {p.parent.name for p in tiny_models.PIPELINES_DIR.glob(f"*/{ADAPTER_MODULE}.py")}
    assert {"qwen_image", "bagel", "sd3", "flux", "z_image"} <= packages
    builtins = tiny_models._builtin_builders()
    assert {name: builtins.get(name) for name in packages} == {
        name: f"verl_omni.pipelines.{name}.{tiny_models.MODEL_PACKAGE_MODULE}" for name in packages
    }
    # builders of what is no model package stay in utils/tiny_models (the reward scorers' CLIP)
    assert builtins["clip"] == "verl_omni.utils.tiny_models.clip"


@pytest.mark.slow
def test_cli_builds_a_model_from_its_package(tmp_path):
    """``python -m verl_omni.utils.tiny_models sd3 --out DIR`` in a new interpreter writes what diffusers reads."""
    import subprocess
    import sys

    out = tmp_path / "sd3"
    subprocess.run(
        [sys.executable, "-m", "verl_omni.utils.tiny_models", "sd3", "--out", str(out)], check=True, timeout=600
    )
    assert json.loads((out / "model_index.json").read_text())["_class_name"] == "StableDiffusion3Pipeline"
    assert (out / "transformer" / "diffusion_pytorch_model.safetensors").is_file()

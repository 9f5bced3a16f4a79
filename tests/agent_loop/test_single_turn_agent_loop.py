"""``DiffusionSingleTurnAgentLoop.prompt_request``: prompts become ids through the checkpoint's model adapter."""

from __future__ import annotations

import json

import pytest


def _checkpoint(root, architecture: str):
    """A checkpoint directory that names its architecture (all the adapter lookup reads)."""
    root.mkdir()
    if architecture.endswith("Pipeline"):
        (root / "model_index.json").write_text(json.dumps({"_class_name": architecture}))
    else:
        (root / "config.json").write_text(json.dumps({"architectures": [architecture]}))
    return root


def _loop(path, data=None):
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap

    from verl_omni.agent_loop.single_turn_agent_loop import DiffusionSingleTurnAgentLoop
    from verl_omni.utils.tiny_models.tokenizer import build_qwen2_tokenizer

    config = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "model": {"path": str(path)},
                "rollout": {
                    "true_cfg_scale": 4.0,
                    "negative_prompt": "blurry",
                    "server_routing": {"routing_key_field": "uid"},
                },
            },
            "data": data or {},
        }
    )
    return DiffusionSingleTurnAgentLoop(
        DictConfigWrap(config=config), server_manager=None, tokenizer=build_qwen2_tokenizer()
    )


@pytest.mark.parametrize("architecture", ["QwenImagePipeline", "BagelForConditionalGeneration"])
def test_prompt_request_uses_the_model_adapters_template(tmp_path, architecture):
    from verl_omni.pipelines.model_base import get_model_adapter

    path = _checkpoint(tmp_path / "model", architecture)
    loop = _loop(path)
    tokenizer = loop.tokenizer
    request = loop.prompt_request(
        {"raw_prompt": [{"role": "user", "content": "a red cat"}], "uid": "u0"}, {"true_cfg_scale": 4.0}
    )

    adapter = get_model_adapter(path)
    assert request.prompt_ids == adapter.prompt_token_ids(tokenizer, "a red cat")
    assert request.negative_prompt_ids == adapter.prompt_token_ids(tokenizer, "blurry")
    assert request.routing_key == "u0"
    others = {
        "QwenImagePipeline": "BagelForConditionalGeneration",
        "BagelForConditionalGeneration": "QwenImagePipeline",
    }
    other = get_model_adapter(_checkpoint(tmp_path / "other", others[architecture]))
    assert request.prompt_ids != other.prompt_token_ids(tokenizer, "a red cat")


def test_an_editing_models_request_carries_the_rows_decoded_source_images_and_names_a_bad_one(tmp_path):
    """Qwen-Image-Edit: the row's ``images`` (verl's references: bytes or a path; ``data.image_key`` renames the
    field) are decoded for the request; a text-to-image model sends none; a missing file names the row and file."""
    import io

    from PIL import Image

    from verl_omni.pipelines.model_base import get_model_adapter

    red = Image.new("RGB", (40, 24), (255, 0, 0))
    buffer = io.BytesIO()
    red.save(buffer, format="PNG")
    Image.new("RGB", (8, 8), (0, 0, 255)).save(tmp_path / "blue.png")
    row = {
        "raw_prompt": [{"role": "user", "content": "make it blue"}],
        "uid": "u0",
        "index": 3,
        "source": [{"bytes": buffer.getvalue()}, {"image": str(tmp_path / "blue.png")}],
    }
    edit = _checkpoint(tmp_path / "edit", "QwenImageEditPipeline")
    loop = _loop(edit, {"image_key": "source"})
    request = loop.prompt_request(row, {"true_cfg_scale": 4.0})
    assert request.prompt_ids == get_model_adapter(edit).prompt_token_ids(loop.tokenizer, "make it blue")
    assert [im.size for im in request.images] == [(40, 24), (8, 8)]
    assert request.images[0].getpixel((0, 0)) == (255, 0, 0) and request.images[1].getpixel((0, 0)) == (0, 0, 255)

    t2i = _loop(_checkpoint(tmp_path / "t2i", "QwenImagePipeline"), {"image_key": "source"})
    assert t2i.prompt_request(row, {"true_cfg_scale": 4.0}).images is None

    row["source"] = [{"image": str(tmp_path / "gone.png")}]
    with pytest.raises(ValueError, match=r"prompt row 3 \(source\), image 0: source image .*gone.png does not exist"):
        loop.prompt_request(row, {"true_cfg_scale": 4.0})

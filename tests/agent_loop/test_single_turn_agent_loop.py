"""``DiffusionSingleTurnAgentLoop.prompt_request``: prompts become ids through the checkpoint's model adapter."""

from __future__ import annotations

import json

import pytest


def _checkpoint(root, architecture: str):
    """A checkpoint directory that names its architecture (all the adapter lookup reads)."""
    root.mkdir()
    if architecture == "QwenImagePipeline":
        (root / "model_index.json").write_text(json.dumps({"_class_name": architecture}))
    else:
        (root / "config.json").write_text(json.dumps({"architectures": [architecture]}))
    return root


@pytest.mark.parametrize("architecture", ["QwenImagePipeline", "BagelForConditionalGeneration"])
def test_prompt_request_uses_the_model_adapters_template(tmp_path, architecture):
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap

    from verl_omni.agent_loop.single_turn_agent_loop import DiffusionSingleTurnAgentLoop
    from verl_omni.pipelines.model_base import get_training_adapter
    from verl_omni.utils.tiny_models.tokenizer import build_qwen2_tokenizer

    path = _checkpoint(tmp_path / "model", architecture)
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "model": {"path": str(path)},
                "rollout": {
                    "true_cfg_scale": 4.0,
                    "negative_prompt": "blurry",
                    "server_routing": {"routing_key_field": "uid"},
                },
            }
        }
    )
    tokenizer = build_qwen2_tokenizer()
    loop = DiffusionSingleTurnAgentLoop(DictConfigWrap(config=config), server_manager=None, tokenizer=tokenizer)
    request = loop.prompt_request(
        {"raw_prompt": [{"role": "user", "content": "a red cat"}], "uid": "u0"}, {"true_cfg_scale": 4.0}
    )

    adapter = get_training_adapter(path)
    assert request.prompt_ids == adapter.prompt_token_ids(tokenizer, "a red cat")
    assert request.negative_prompt_ids == adapter.prompt_token_ids(tokenizer, "blurry")
    assert request.routing_key == "u0"
    others = {
        "QwenImagePipeline": "BagelForConditionalGeneration",
        "BagelForConditionalGeneration": "QwenImagePipeline",
    }
    other = get_training_adapter(_checkpoint(tmp_path / "other", others[architecture]))
    assert request.prompt_ids != other.prompt_token_ids(tokenizer, "a red cat")

"""The engine is found in verl's registry for a diffusion model, and its adapter from the checkpoint."""

import pytest


def test_diffusion_model_resolves_to_diffusers_fsdp_engine_on_cpu():
    from verl.workers.engine.base import EngineRegistry

    from verl_omni.workers.engine.fsdp.diffusers_impl import DiffusersFSDPEngine

    assert EngineRegistry.get_engine_cls("diffusion_model", "fsdp2") is DiffusersFSDPEngine
    assert EngineRegistry._engines["diffusion_model"]["fsdp2"]["cuda"] is DiffusersFSDPEngine


def test_training_adapter_is_looked_up_from_model_index(tiny_qwen_image_path, tmp_path):
    from verl_omni.pipelines.model_base import get_model_adapter
    from verl_omni.pipelines.qwen_image.training_adapter import QwenImageTrainingAdapter

    assert get_model_adapter(tiny_qwen_image_path) is QwenImageTrainingAdapter
    (tmp_path / "model_index.json").write_text('{"_class_name": "NoSuchPipeline"}')
    with pytest.raises(ValueError, match="QwenImagePipeline"):
        get_model_adapter(tmp_path)


def test_engine_rejects_fsdp1(tiny_qwen_image_path):
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig

    from verl_omni.workers.config.model import DiffusionModelConfig
    from verl_omni.workers.engine.fsdp.diffusers_impl import DiffusersFSDPEngine

    model = DiffusionModelConfig(path=str(tiny_qwen_image_path))
    with pytest.raises(ValueError, match="engine.strategy"):
        DiffusersFSDPEngine(model, FSDPEngineConfig(strategy="fsdp"), FSDPOptimizerConfig(), CheckpointConfig())

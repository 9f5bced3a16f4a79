"""The HunyuanVideo-1.5 training adapters' facts against the tiny checkpoints and diffusers (CPU, fp32).

The rollout ↔ replay checks on the real engine are ``test_diffusers_rollout_engine.py`` (``hunyuan_video_1_5``,
``hunyuan_video_1_5_i2v``) and the text-to-video trainer run is ``test_flowgrpo_models_e2e.py``; here are the facts
those read (registration, the size and frame multiples, the schedule both pipelines sample with, the LoRA targets
and their exclusion) and what no trainer run shows for the image-to-video model: its saved LoRA, loaded as the run
summary prints it, changes diffusers' image-to-video pipeline's video.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from verl_omni.pipelines.hunyuan_video_1_5.training_adapter import (
    HunyuanVideo15I2VTrainingAdapter,
    HunyuanVideo15TrainingAdapter,
)

ADAPTERS = {
    "hunyuan_video_1_5": HunyuanVideo15TrainingAdapter,
    "hunyuan_video_1_5_i2v": HunyuanVideo15I2VTrainingAdapter,
}


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_registered_under_the_pipeline_class_with_the_vaes_multiples(tiny_model, name):
    from verl_omni.pipelines.model_base import get_model_adapter

    path = tiny_model(name)
    adapter = ADAPTERS[name]
    assert get_model_adapter(path) is adapter
    vae = json.loads((path / "vae" / "config.json").read_text())
    patch = json.loads((path / "transformer" / "config.json").read_text())["patch_size"]
    assert adapter.vae_scale_factor(path) == vae["spatial_compression_ratio"] == 16
    assert adapter.latent_multiple == vae["spatial_compression_ratio"] * patch
    assert adapter.frame_multiple == vae["temporal_compression_ratio"]


def test_a_step_distilled_meanflow_checkpoint_is_refused_naming_the_key(tiny_model, tmp_path):
    from verl_omni.pipelines.model_base import get_model_adapter

    path = tmp_path / "meanflow"
    shutil.copytree(tiny_model("hunyuan_video_1_5"), path)
    config_file = path / "transformer" / "config.json"
    config_file.write_text(json.dumps(json.loads(config_file.read_text()) | {"use_meanflow": True}))
    with pytest.raises(ValueError, match="transformer/config.json has use_meanflow=true"):
        get_model_adapter(path)


@pytest.mark.parametrize("steps", [4, 50])
def test_the_replays_schedule_is_the_pipelines_with_the_checkpoints_shift(tiny_model, steps):
    """Both pipelines set σ = linspace(1, 0, T + 1)[:-1] on the checkpoint's flow-match scheduler (shift 5)."""
    import numpy as np
    from diffusers import FlowMatchEulerDiscreteScheduler

    from verl_omni.pipelines.sampling import SamplingSpec

    path = tiny_model("hunyuan_video_1_5")
    scheduler = HunyuanVideo15TrainingAdapter.build_scheduler(path)
    HunyuanVideo15TrainingAdapter.set_schedule(scheduler, SamplingSpec(num_inference_steps=steps, sde_window_size=1), 0)
    stock = FlowMatchEulerDiscreteScheduler.from_pretrained(path, subfolder="scheduler")
    stock.set_timesteps(sigmas=np.linspace(1.0, 0.0, steps + 1)[:-1])
    assert stock.config.shift == 5.0
    torch.testing.assert_close(scheduler.sigmas, stock.sigmas, rtol=0, atol=1e-7)
    torch.testing.assert_close(scheduler.timesteps, stock.timesteps, rtol=0, atol=1e-4)


def test_lora_targets_bind_the_dual_stream_blocks_and_not_the_token_refiner(tiny_model):
    from peft import LoraConfig

    adapter = HunyuanVideo15TrainingAdapter
    module = adapter.build_module(tiny_model("hunyuan_video_1_5"))
    module.add_adapter(
        LoraConfig(r=2, target_modules=list(adapter.lora_target_modules), exclude_modules=adapter.lora_exclude_modules)
    )
    wrapped = {n.rsplit(".lora_A", 1)[0] for n, _ in module.named_parameters() if ".lora_A." in n}
    blocks = len(module.transformer_blocks)
    assert len(wrapped) == blocks * len(adapter.lora_target_modules)
    assert all(n.startswith("transformer_blocks.") for n in wrapped)
    assert any(".token_refiner." in n and n.endswith("attn.to_q") for n, _ in module.named_modules())


def test_i2v_lora_saved_by_the_checkpoint_loads_as_the_summary_prints_and_changes_the_video(tiny_model, tmp_path):
    """The I2V checkpoint's LoRA file, loaded by the run summary's diffusers lines (the transformer's
    ``load_lora_adapter``: diffusers' HunyuanVideo-1.5 pipelines have no LoRA loader), changes the pipeline's video
    (sampled at the tiny transformer's 32-pixel size bucket: the pipeline sizes the video by the source image)."""
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict
    from PIL import Image

    from verl_omni.trainer.diffusion.summary import diffusers_lines
    from verl_omni.workers.engine.fsdp.checkpoint import save_lora_dir

    adapter, path = HunyuanVideo15I2VTrainingAdapter, tiny_model("hunyuan_video_1_5_i2v")
    module = adapter.build_module(path)
    torch.manual_seed(0)
    config = LoraConfig(
        r=4,
        lora_alpha=8,
        target_modules=list(adapter.lora_target_modules),
        exclude_modules=adapter.lora_exclude_modules,
        init_lora_weights=False,
    )
    module.add_adapter(config)
    save_lora_dir(adapter, tmp_path / "lora", get_peft_model_state_dict(module), config.to_dict())
    namespace = {}
    exec("\n".join(diffusers_lines(adapter.lora_file_pipeline, str(path), tmp_path / "lora")), namespace)
    pipe = namespace["pipe"]
    assert type(pipe).__name__ == "HunyuanVideo15ImageToVideoPipeline" and pipe.transformer.active_adapters()
    pipe.set_progress_bar_config(disable=True)

    def video():
        return pipe(
            image=Image.new("RGB", (32, 32), (200, 40, 40)),
            prompt="a red cat",
            num_frames=5,
            num_inference_steps=2,
            generator=torch.Generator().manual_seed(0),
            output_type="pt",
        ).frames

    tuned = video()
    pipe.transformer.disable_lora()
    base = video()
    assert tuned.shape == base.shape == (1, 5, 3, 32, 32)
    assert bool(torch.isfinite(tuned).all()) and (tuned - base).abs().max() > 1e-4

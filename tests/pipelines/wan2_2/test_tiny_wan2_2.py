"""The tiny random Wan2.2 TI2V-5B: the 5B's layout and VAE facts, deterministic, and read by its two clients
(diffusers' ``WanPipeline`` and stock vLLM-Omni 0.26's ``Wan22Pipeline``), generating a few frames at 32² on CPU."""

from __future__ import annotations

import json

import pytest
import torch

from verl_omni.utils.tiny_models import build_tiny_model, directory_digest

PROMPT = "a red cube on a table"


@pytest.fixture(scope="module")
def tiny_wan(tiny_model):
    return tiny_model("wan2_2")


def test_layout_is_the_ti2v_5b_checkpoints(tiny_wan):
    index = json.loads((tiny_wan / "model_index.json").read_text())
    assert index["_class_name"] == "WanPipeline" and index["expand_timesteps"] is True
    assert index["transformer_2"] == [None, None] and index["boundary_ratio"] is None
    vae = json.loads((tiny_wan / "vae" / "config.json").read_text())
    # the 5B VAE: 2x2 pixel patchify, 16 pixels per latent cell, 4 frames per latent frame
    assert (vae["patch_size"], vae["scale_factor_spatial"], vae["scale_factor_temporal"]) == (2, 16, 4)
    assert vae["is_residual"] and vae["in_channels"] == 12
    scheduler = json.loads((tiny_wan / "scheduler" / "scheduler_config.json").read_text())
    assert scheduler["_class_name"] == "UniPCMultistepScheduler" and scheduler["flow_shift"] == 5.0


def test_builder_is_deterministic_per_seed_and_small(tiny_wan, tmp_path):
    assert directory_digest(build_tiny_model("wan2_2", tmp_path / "same", seed=0)) == directory_digest(tiny_wan)
    assert directory_digest(build_tiny_model("wan2_2", tmp_path / "other", seed=1)) != directory_digest(tiny_wan)
    assert sum(f.stat().st_size for f in tiny_wan.rglob("*") if f.is_file()) < 5 * 2**20


def test_diffusers_generates_a_video_of_4k_plus_1_frames(tiny_wan):
    from diffusers import WanPipeline

    pipe = WanPipeline.from_pretrained(tiny_wan)
    pipe.set_progress_bar_config(disable=True)
    kwargs = {"height": 32, "width": 64, "num_frames": 5, "num_inference_steps": 2, "output_type": "pt"}
    a = pipe(PROMPT, generator=torch.Generator().manual_seed(0), **kwargs).frames
    b = pipe(PROMPT, generator=torch.Generator().manual_seed(1), **kwargs).frames
    assert a.shape == (1, 5, 3, 32, 64)
    assert torch.isfinite(a).all() and 0 <= a.min() and a.max() <= 1
    assert (a - b).abs().max() > 1e-3


@pytest.mark.slow
def test_stock_vllm_omni_loads_and_generates_frames(tiny_wan):
    """Nothing of ours in the engine but the CPU platform plugin: vLLM-Omni's own ``Wan22Pipeline``."""
    from vllm_omni.entrypoints.omni import Omni
    from vllm_omni.inputs.data import OmniDiffusionSamplingParams

    from verl_omni.platforms.cpu_patches import engine_start_config

    omni = Omni(
        model=str(tiny_wan),
        dtype="float32",
        additional_config=engine_start_config((32, 32), 1200, "the test's start timeout"),
        init_timeout=1200,
        stage_init_timeout=1200,
    )
    try:
        params = OmniDiffusionSamplingParams(
            height=32, width=64, num_frames=5, num_inference_steps=2, guidance_scale=4.0, seed=0
        )
        (output,) = omni.generate([{"prompt": PROMPT}], params)
    finally:
        omni.close()
    (video,) = output.images
    assert video.shape == (1, 5, 32, 64, 3)

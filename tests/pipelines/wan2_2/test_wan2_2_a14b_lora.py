"""The two-expert Wan2.2 (A14B layout, tiny) as a LoRA-trained module: one adapter over both experts, its names
for the rollout, the checkpoint's LoRA read by its client, diffusers' ``WanPipeline`` with two transformers, and the
engine's step on two FSDP ranks that each hold one expert's samples (``two_rank_experts.py``).

The rollout side (the LoRA synced in memory to both experts, replayed ≤ 1e-5) is
``tests/workers/rollout/vllm_omni/test_wan2_2_a14b_rollout.py``; the trainer end to end is
``tests/trainer/test_flowgrpo_models_e2e.py`` (``wan2_2_a14b``).
"""

from __future__ import annotations

import pytest
import torch

from verl_omni.pipelines.wan2_2.training_adapter import EXPERTS, Wan22A14BTrainingAdapter, Wan22TrainingAdapter

ADAPTER = Wan22A14BTrainingAdapter


@pytest.fixture(scope="module")
def tiny_path(tiny_model):
    return tiny_model("wan2_2_a14b")


def with_lora(tiny_path, init_lora_weights=False, seed=0):
    """The adapter's training module with a rank-4 LoRA on the adapter's targets (random unless ``init`` is True)."""
    from peft import LoraConfig

    module = ADAPTER.build_module(tiny_path).eval()
    torch.manual_seed(seed)
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=list(ADAPTER.lora_target_modules), init_lora_weights=init_lora_weights
    )
    module.add_adapter(config)
    return module


@pytest.fixture(scope="module")
def trained(tiny_path):
    return with_lora(tiny_path)


def test_one_adapter_covers_both_experts_and_the_rollout_names_keep_the_expert(trained):
    from verl_omni.workers.engine.fsdp.checkpoint import gather_lora_state_dict

    lora = gather_lora_state_dict(trained)
    for expert in EXPERTS:
        blocks = len(getattr(trained, expert).blocks)
        # per block: attn1 and attn2, each to_q/to_k/to_v/to_out.0, lora_A and lora_B
        assert sum(name.startswith(f"{expert}.blocks.") for name in lora) == blocks * 2 * 4 * 2
    assert not [n for n, p in trained.named_parameters() if p.requires_grad and "lora_" not in n]
    config, tensors = ADAPTER.rollout_lora(lora, trained.peft_config["default"].to_dict())
    # full names: vLLM-Omni's LoRA manager looks a layer up by ``<component>.<module>`` first
    assert "base_model.model.transformer_2.blocks.0.attn1.to_out.lora_A.weight" in tensors
    assert "base_model.model.transformer.blocks.1.attn2.to_q.lora_B.weight" in tensors
    assert all(n.startswith(tuple(f"base_model.model.{e}.blocks." for e in EXPERTS)) for n in tensors)
    assert config["target_modules"] == ["to_k", "to_out", "to_q", "to_v"]


def test_each_step_goes_to_its_expert_through_the_module(trained):
    """High-noise steps (t >= 875) get ``transformer``'s velocity, the others ``transformer_2``'s, in one batch."""
    from verl_omni.pipelines.sampling import SamplingSpec

    torch.manual_seed(0)
    batch = {
        "all_latents": torch.randn(3, 2, 4, 2, 2, 2),
        "all_timesteps": torch.tensor([[950.0, 700.0], [870.0, 880.0], [600.0, 500.0]]),
        "prompt_embeds": torch.randn(3, 4, 32),
        "prompt_embeds_mask": torch.ones(3, 4, dtype=torch.long),
    }
    spec = SamplingSpec(num_inference_steps=4, height=16, width=16, num_frames=5, true_cfg_scale=1.0)
    with torch.no_grad():
        for step in (0, 1):
            velocity = ADAPTER.step_velocity(trained, batch, step, spec, 8)
            for expert in EXPERTS:
                alone = Wan22TrainingAdapter.step_velocity(getattr(trained, expert), batch, step, spec, 8)
                rows = ADAPTER.high_noise(batch["all_timesteps"][:, step])
                rows = rows if expert == "transformer" else ~rows
                # a sub-batch of the rows: the same math, other batch sizes (float rounding only)
                torch.testing.assert_close(velocity[rows], alone[rows], rtol=0, atol=1e-5)
                assert (velocity[~rows] - alone[~rows]).abs().max() > 1e-3


def test_saved_lora_loads_into_both_experts_of_diffusers_wan_pipeline_and_changes_the_video(
    tiny_path, trained, tmp_path
):
    from diffusers import WanPipeline

    from verl_omni.workers.engine.fsdp.checkpoint import (
        ADAPTER_NAME,
        gather_lora_state_dict,
        load_lora_into,
        lora_load_calls,
        save_lora_dir,
    )

    lora = gather_lora_state_dict(trained)
    save_lora_dir(ADAPTER, tmp_path / "lora", lora, trained.peft_config[ADAPTER_NAME].to_dict())
    calls = lora_load_calls(tmp_path / "lora")
    assert calls == [
        {},
        {"weight_name": "pytorch_lora_weights_transformer_2.safetensors", "load_into_transformer_2": True},
    ]
    pipe = WanPipeline.from_pretrained(tiny_path)
    pipe.set_progress_bar_config(disable=True)
    for kwargs in calls:
        pipe.load_lora_weights(tmp_path / "lora", **kwargs)
    # each expert holds its own trained LoRA (diffusers names the adapter default_0 in each)
    for expert in EXPERTS:
        loaded = {
            name.replace(".default_0", ""): p for name, p in getattr(pipe, expert).named_parameters() if "lora_" in name
        }
        mine = {n[len(expert) + 1 :]: t for n, t in lora.items() if n.startswith(f"{expert}.")}
        assert loaded.keys() == mine.keys()
        for name, tensor in mine.items():
            torch.testing.assert_close(loaded[name].detach(), tensor, rtol=0, atol=0)

    kwargs = dict(prompt="a red cat", height=32, width=32, num_frames=5, num_inference_steps=2, output_type="pt")

    def sample():
        return pipe(generator=torch.Generator().manual_seed(0), **kwargs).frames

    tuned = sample()
    # the 2 steps are one per expert (UniPC timesteps 999 and 833, the boundary 875): each expert's LoRA shows
    for expert in EXPERTS:
        getattr(pipe, expert).disable_adapters()
        without = sample()
        getattr(pipe, expert).enable_adapters()
        assert (tuned - without).abs().max() > 1e-4, f"{expert}'s LoRA does not change the video"
    pipe.disable_lora()
    base = sample()
    assert bool(torch.isfinite(tuned).all()) and (tuned - base).abs().max() > 1e-4

    # and a resume reads the same files back into the training module
    fresh = with_lora(tiny_path, init_lora_weights=True)
    load_lora_into(fresh, tmp_path / "lora", ADAPTER.lora_components)
    for name, tensor in gather_lora_state_dict(fresh).items():
        torch.testing.assert_close(tensor, lora[name], rtol=0, atol=0)


def test_a_lora_file_missing_an_expert_is_refused(trained):
    from verl_omni.workers.engine.fsdp.checkpoint import _component_tensors, gather_lora_state_dict

    lora = {n: t for n, t in gather_lora_state_dict(trained).items() if n.startswith("transformer.")}
    with pytest.raises(ValueError, match="empty"):
        _component_tensors(lora, EXPERTS)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_two_ranks_each_with_one_experts_samples_train_both_as_one_process(tiny_path, tmp_path):
    """``DiffusersFSDPEngine`` on two gloo ranks (``two_rank_experts.py``), rank 0 holding only high-noise samples and
    rank 1 only low-noise ones: the step completes (each rank runs both experts, the idle one at weight 0) and the
    LoRA gradients averaged over the ranks equal one unsharded process's over the whole batch."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from peft import LoraConfig
    from peft.utils import set_peft_model_state_dict

    from verl_omni.pipelines.sampling import SamplingSpec

    torch.manual_seed(1)
    batch = {
        "all_latents": torch.randn(4, 2, 4, 2, 2, 2),
        "all_timesteps": torch.tensor([[950.0, 700.0], [900.0, 600.0], [700.0, 500.0], [600.0, 400.0]]),
        "prompt_embeds": torch.randn(4, 4, 32),
        "prompt_embeds_mask": torch.ones(4, 4, dtype=torch.long),
    }
    torch.save(batch, tmp_path / "batch.pt")
    here = Path(__file__).resolve().parent
    # --standalone: the launcher's store takes a port the OS assigns (no pick-then-bind race with other processes)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd += [str(here / "two_rank_experts.py"), str(tmp_path / "batch.pt"), str(tiny_path), str(tmp_path / "out.pt")]
    env = dict(os.environ, PYTHONPATH=f"{here.parents[2]}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1700)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    result = torch.load(tmp_path / "out.pt")
    assert result["rows"] == [2, 2]

    module = ADAPTER.build_module(tiny_path)
    module.add_adapter(
        LoraConfig(r=4, lora_alpha=8, target_modules=list(ADAPTER.lora_target_modules), init_lora_weights=False)
    )
    set_peft_model_state_dict(module, result["start"], adapter_name="default")
    spec = SamplingSpec(num_inference_steps=4, height=16, width=16, num_frames=5, true_cfg_scale=1.0)
    module.train()
    ADAPTER.step_velocity(module, batch, 0, spec, 8).square().mean().backward()
    reference = {n: p.grad for n, p in module.named_parameters() if p.requires_grad}
    assert reference.keys() == result["grads"].keys()
    for expert in EXPERTS:
        assert any(n.startswith(f"{expert}.") and float(g.abs().max()) > 0 for n, g in reference.items())
    for name, grad in reference.items():
        torch.testing.assert_close(result["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=name)

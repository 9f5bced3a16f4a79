"""BAGEL's adapter pieces without an engine: lookup, schedule, the step convention, CFG, rollout names."""

import json

import pytest
import torch

from verl_omni.pipelines.bagel.training_adapter import BagelTrainingAdapter, bagel_sigmas, set_bagel_schedule


def test_adapter_is_found_from_config_architectures(tmp_path):
    from verl_omni.pipelines.model_base import get_model_adapter

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["BagelForConditionalGeneration"]}))
    assert get_model_adapter(tmp_path) is BagelTrainingAdapter
    with pytest.raises(FileNotFoundError, match="architectures"):
        get_model_adapter(tmp_path / "missing")


def test_schedule_is_bagels_shifted_linspace_and_steps_resolve():
    from verl_omni.pipelines.schedulers.flow_match_sde import FlowMatchSDEDiscreteScheduler, step_indices_for_timesteps

    sigmas = bagel_sigmas(4, 3.0)
    t = torch.linspace(1, 0, 5)
    torch.testing.assert_close(sigmas, 3.0 * t / (1 + 2.0 * t))
    scheduler = FlowMatchSDEDiscreteScheduler()
    set_bagel_schedule(scheduler, 4, 3.0)
    assert step_indices_for_timesteps(scheduler, sigmas[:4], 4).tolist() == [0, 1, 2, 3]


def test_sde_step_behind_bagels_convention_is_euler_without_noise_and_records_the_window():
    from verl_omni.pipelines.bagel.rollout_pipeline import BagelSDEStep
    from verl_omni.pipelines.recorder import RolloutRecorder
    from verl_omni.pipelines.rollout_request import RolloutRequest
    from verl_omni.pipelines.sampling import SamplingSpec
    from verl_omni.pipelines.schedulers.flow_match_sde import FlowMatchSDEDiscreteScheduler, schedule_sigmas

    scheduler = FlowMatchSDEDiscreteScheduler()
    set_bagel_schedule(scheduler, 4, 3.0)
    sigmas = scheduler.sigmas

    def stepper(window_start: int = 1) -> BagelSDEStep:
        spec = SamplingSpec(num_inference_steps=4, noise_level=0.7, sde_window_size=2, seeds=[0])
        request = RolloutRequest([1], None, spec, window_starts=[window_start])
        recorder = RolloutRecorder([request], torch.device("cpu"))
        recorder.set_schedule(schedule_sigmas(scheduler), scheduler.timesteps)
        return BagelSDEStep(recorder)

    bagel = stepper()
    x, v = torch.randn(4, 64), torch.randn(4, 64)
    for i in range(4):
        dt = sigmas[i] - sigmas[i + 1]
        out = bagel.step(v, sigmas[i], x, dt)
        if i in (0, 3):  # outside the window: BAGEL's own Euler step x - v·dt
            torch.testing.assert_close(out.prev_sample, x - v * dt)
        x = out.prev_sample
    bagel.check_schedule()
    (recorded,) = bagel.recorder.split()
    assert recorded["all_latents"].shape == (1, 3, 4, 64) and recorded["rollout_log_probs"].shape == (1, 2)
    torch.testing.assert_close(recorded["all_timesteps"][0], sigmas[1:3])
    off = stepper()
    off.step(v, torch.tensor(0.5), x, torch.tensor(0.1))
    with pytest.raises(RuntimeError, match="schedule"):
        off.check_schedule()


@pytest.mark.parametrize("renorm", ["global", "channel", "text_channel"])
@pytest.mark.parametrize("image_scale", [1.0, 1.5])
def test_guidance_equals_vllm_omni_bagel_cfg_for_text_to_image(renorm, image_scale):
    from vllm_omni.diffusion.models.bagel.bagel_transformer import Bagel

    from verl_omni.pipelines.bagel.modeling import Guidance

    gen = torch.Generator().manual_seed(1)
    v, v_text = torch.randn(6, 64, generator=gen), torch.randn(6, 64, generator=gen)
    guidance = Guidance(text_scale=4.0, image_scale=image_scale, renorm_type=renorm, renorm_min=0.1)
    # text-to-image: vLLM-Omni's image-free branch sees the conditional context, so it predicts v
    expected = Bagel._combine_cfg(v, v_text, v, 4.0, image_scale, renorm, 0.1)
    torch.testing.assert_close(guidance.combine(v, v_text), expected)


def test_trained_names_map_to_vllm_omni_module_names():
    from verl_omni.pipelines.qwen_image.training_adapter import QwenImageTrainingAdapter

    name = "language_model.model.layers.1.mlp_moe_gen.gate_proj.lora_A.weight"
    assert BagelTrainingAdapter.rollout_name(name) == "layers.1.mlp_moe_gen.gate_proj.lora_A.weight"
    assert (
        QwenImageTrainingAdapter.rollout_name("transformer_blocks.0.attn.to_out.0")
        == "transformer_blocks.0.attn.to_out"
    )
    config = BagelTrainingAdapter.rollout_peft_config({"r": 4, "target_modules": {"mlp_moe_gen.up_proj"}})
    assert config["target_modules"] == ["mlp_moe_gen.up_proj"] and config["r"] == 4


def test_prompt_template_frames_the_turn_and_an_empty_prompt_is_no_context():
    from verl_omni.utils.tiny_models.tokenizer import build_qwen2_tokenizer

    tokenizer = build_qwen2_tokenizer()
    ids = BagelTrainingAdapter.prompt_token_ids(tokenizer, "a red cat")
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert ids[1:-1] == tokenizer.encode("a red cat", add_special_tokens=False)
    assert BagelTrainingAdapter.prompt_token_ids(tokenizer, "") == []

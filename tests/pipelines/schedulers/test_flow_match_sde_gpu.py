"""On CUDA, the SDE step computes in fp32 whatever the model dtype and agrees with the CPU result."""

import pytest
import torch
from figures import figure

from verl_omni.algorithms.flow_grpo_math import compute_flow_grpo_policy_loss
from verl_omni.pipelines.qwen_image.tiny_model import QWEN_IMAGE_SCHEDULER_CONFIG
from verl_omni.pipelines.schedulers import FlowMatchSDEDiscreteScheduler, sde_step_with_logprob

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("sde_type", ["sde", "cps"])
def test_cuda_step_matches_cpu_with_bf16_model_output(sde_type):
    sched = FlowMatchSDEDiscreteScheduler(**QWEN_IMAGE_SCHEDULER_CONFIG)
    sched.set_timesteps(10, mu=0.8)
    g = torch.Generator().manual_seed(0)
    x, v, prev = (torch.randn(4, 256, 64, generator=g) for _ in range(3))
    v = v.bfloat16()
    t = sched.timesteps[torch.tensor([0, 2, 4, 9])]
    a = torch.tensor([0.7, 1.2, 0.3, 1.0])

    cpu = sde_step_with_logprob(sched, v, t, x, a, prev_sample=prev, sde_type=sde_type)
    gpu = sde_step_with_logprob(
        sched, v.cuda(), t.cuda(), x.cuda(), a.cuda(), prev_sample=prev.cuda(), sde_type=sde_type
    )

    assert gpu.log_prob.dtype == torch.float32 and gpu.log_prob.is_cuda
    diff = (gpu.log_prob.cpu() - cpu.log_prob).abs().max().item()
    figure("logprob_diff_cuda_vs_cpu", diff)
    torch.testing.assert_close(gpu.log_prob.cpu(), cpu.log_prob, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gpu.prev_sample_mean.cpu(), cpu.prev_sample_mean, rtol=1e-5, atol=1e-5)


def test_cuda_sampling_with_per_sample_generators_is_reproducible():
    sched = FlowMatchSDEDiscreteScheduler(**QWEN_IMAGE_SCHEDULER_CONFIG)
    sched.set_timesteps(10, mu=0.8)
    x = torch.randn(2, 64, 16, device="cuda")
    v = torch.randn(2, 64, 16, device="cuda")

    def draw():
        gens = [torch.Generator("cuda").manual_seed(s) for s in (1, 2)]
        return sde_step_with_logprob(sched, v, sched.timesteps[1], x, 1.0, generator=gens).prev_sample

    torch.testing.assert_close(draw(), draw())


def test_cuda_loss_backward_direction():
    lp = torch.zeros(8, device="cuda", requires_grad=True)
    adv = torch.tensor([1.0, -1.0] * 4, device="cuda")
    loss, metrics = compute_flow_grpo_policy_loss(lp, torch.zeros(8, device="cuda"), adv)
    loss.backward()
    assert torch.all(-lp.grad * adv > 0) and metrics["ratio_mean"] == pytest.approx(1.0)


def test_tiny_qwen_image_generates_in_bf16_on_cuda(tiny_qwen_image_bf16_path):
    from diffusers import QwenImagePipeline

    # diffusers loads fp32 unless told otherwise (transformers loads the saved dtype)
    pipe = QwenImagePipeline.from_pretrained(tiny_qwen_image_bf16_path, torch_dtype=torch.bfloat16).to("cuda")
    pipe.set_progress_bar_config(disable=True)
    img = pipe(
        prompt="a red cat",
        height=32,
        width=32,
        num_inference_steps=3,
        generator=torch.Generator("cuda").manual_seed(0),
        output_type="pt",
    ).images
    assert img.shape == (1, 3, 32, 32) and torch.isfinite(img.float()).all()

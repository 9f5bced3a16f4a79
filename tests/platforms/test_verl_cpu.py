"""verl resolves our CPU platform on a machine without CUDA, through the plugin entry point alone."""

import pytest


@pytest.mark.slow
def test_importing_verl_selects_the_cpu_platform_with_working_helpers(fresh_python):
    # a fresh interpreter that imports only verl, as a Ray worker would
    code = (
        "import torch, verl\n"
        "from verl.utils.device import get_device_name, get_device_id, get_torch_device, get_nccl_backend\n"
        "from verl.utils.fsdp_utils import fsdp2_clip_grad_norm_\n"
        "assert not torch.cuda.is_available()\n"
        "free, total = get_torch_device().mem_get_info()\n"
        "get_torch_device().empty_cache()\n"
        "p = torch.nn.Parameter(torch.ones(4)); p.grad = torch.full((4,), 3.0)\n"
        "norm = fsdp2_clip_grad_norm_([p], max_norm=1.0)\n"
        "print(get_device_name(), get_device_id(), get_nccl_backend(), 0 < free <= total, norm.device, float(norm))\n"
    )
    stdout = fresh_python(code)
    assert stdout.split() == ["cpu", "cpu", "gloo", "True", "cpu", "6.0"]


def test_cpu_platform_steps_aside_when_a_cuda_device_is_present(monkeypatch):
    import torch

    from verl_omni.platforms import verl_cpu

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not verl_cpu.PlatformCPU().is_platform_available(use_smi_check=True)

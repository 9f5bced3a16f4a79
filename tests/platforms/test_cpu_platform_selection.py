"""Our CPU platforms are registered on vLLM's and vLLM-Omni's entry points and chosen only on CPU."""

import importlib.metadata

import pytest

from verl_omni import platforms


@pytest.mark.parametrize(
    ("group", "value"),
    [
        ("vllm.platform_plugins", "verl_omni.platforms:vllm_platform_plugin"),
        ("vllm_omni.platform_plugins", "verl_omni.platforms:omni_platform_plugin"),
        ("vllm_omni.general_plugins", "verl_omni.platforms:omni_general_plugin"),
    ],
)
def test_platform_entry_points_are_installed(group, value):
    assert value in {ep.value for ep in importlib.metadata.entry_points(group=group)}


def test_explicit_switch_forces_or_disables_the_cpu_platforms(monkeypatch):
    monkeypatch.setenv(platforms.CPU_PLATFORM_ENV, "1")
    assert platforms.vllm_platform_plugin() == platforms.VLLM_CPU_PLATFORM
    assert platforms.omni_platform_plugin() == platforms.OMNI_CPU_PLATFORM
    monkeypatch.setenv(platforms.CPU_PLATFORM_ENV, "0")
    assert platforms.vllm_platform_plugin() is None
    assert platforms.omni_platform_plugin() is None


def test_bad_switch_value_names_the_variable(monkeypatch):
    monkeypatch.setenv(platforms.CPU_PLATFORM_ENV, "maybe")
    with pytest.raises(ValueError, match=platforms.CPU_PLATFORM_ENV):
        platforms.cpu_platform_enabled()


def test_auto_mode_follows_accelerator_detection(monkeypatch):
    monkeypatch.delenv(platforms.CPU_PLATFORM_ENV, raising=False)
    monkeypatch.setattr(platforms, "_accelerator_present", lambda: True)
    assert platforms.omni_platform_plugin() is None
    monkeypatch.setattr(platforms, "_accelerator_present", lambda: False)
    assert platforms.omni_platform_plugin() == platforms.OMNI_CPU_PLATFORM


@pytest.mark.slow
def test_a_fresh_process_resolves_our_platforms_and_their_host_hooks(fresh_python):
    code = (
        "import os\n"
        "os.environ.pop('VERL_OMNI_CPU_PLATFORM', None)\n"
        "from vllm.platforms import current_platform as p\n"
        "from vllm_omni.platforms import current_omni_platform as o\n"
        "free, total = o.get_device_memory()\n"
        "assert 0 < free <= total, (free, total)\n"
        "assert o.dist_backend == 'gloo' and not o.is_pin_memory_available()\n"
        "assert o.get_diffusion_attn_backend_cls(None, 64).endswith('SDPABackend')\n"
        "o.synchronize(); o.empty_cache(); o.set_device(None)\n"
        "print(type(p).__name__, type(o).__name__)\n"
    )
    stdout = fresh_python(code)
    assert "VerlOmniCpuPlatform VerlOmniCpuOmniPlatform" in stdout


@pytest.mark.slow
def test_a_cpu_process_importing_vllm_starts_no_humming_builds(fresh_python):
    # vLLM's quantization utilities import humming, whose import starts its builds as subprocesses (recorded
    # here as they start: they end within seconds); on the CPU platform those builds stay off
    code = (
        "import os, subprocess\n"
        "os.environ.pop('HUMMING_DISABLE_PARALLEL_BUILD', None)\n"
        "started, popen_init = [], subprocess.Popen.__init__\n"
        "def record(self, args, *a, **k):\n"
        "    started.append(' '.join(map(str, args)) if isinstance(args, list) else str(args))\n"
        "    popen_init(self, args, *a, **k)\n"
        "subprocess.Popen.__init__ = record\n"
        "from vllm_omni.entrypoints.async_omni import AsyncOmni\n"
        "import humming\n"
        "print('humming builds:', [c for c in started if 'humming' in c])\n"
    )
    assert "humming builds: []" in fresh_python(code)

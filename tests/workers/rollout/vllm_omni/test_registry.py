"""verl resolves rollout name ``vllm_omni`` to our replica once its plugin has loaded."""

import subprocess
import sys


def test_importing_verl_alone_registers_the_vllm_omni_rollout():
    # a fresh interpreter that imports only verl, as a Ray worker would
    code = (
        "import verl\n"
        "from verl.workers.rollout.replica import RolloutReplicaRegistry\n"
        "cls = RolloutReplicaRegistry.get('vllm_omni')\n"
        "server = cls.__init__.__module__\n"
        "print(cls.__module__, cls.__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "verl_omni.workers.rollout.vllm_omni.server vLLMOmniReplica" in out.stdout


def test_server_overrides_the_text_engine_methods():
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer

    from verl_omni.workers.rollout.vllm_omni.server import vLLMOmniHttpServer

    assert issubclass(vLLMOmniHttpServer, vLLMHttpServer)
    for name in ("generate", "generate_batched", "sleep", "wake_up", "abort_all_requests", "load_lora_tensors"):
        assert getattr(vLLMOmniHttpServer, name) is not getattr(vLLMHttpServer, name, None), name

"""The vLLM-Omni server overrides what verl's text server would do (the registration itself: tests/sanity)."""


def test_server_overrides_the_text_engine_methods():
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer

    from verl_omni.workers.rollout.vllm_omni.server import vLLMOmniHttpServer

    assert issubclass(vLLMOmniHttpServer, vLLMHttpServer)
    for name in ("generate", "generate_batched", "sleep", "wake_up", "abort_all_requests", "load_lora_tensors"):
        assert getattr(vLLMOmniHttpServer, name) is not getattr(vLLMHttpServer, name, None), name

"""The vLLM-Omni server overrides what verl's text server would do (the registration itself: tests/sanity)."""


def test_server_overrides_the_text_engine_methods():
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer

    from verl_omni.workers.rollout.vllm_omni.server import vLLMOmniHttpServer

    assert issubclass(vLLMOmniHttpServer, vLLMHttpServer)
    for name in ("generate", "generate_batched", "sleep", "wake_up", "abort_all_requests", "load_lora_tensors"):
        assert getattr(vLLMOmniHttpServer, name) is not getattr(vLLMHttpServer, name, None), name


def test_a_replica_spans_its_sequence_parallel_devices_too():
    """verl sizes a replica as tp x dp x pp devices; ours counts the sequence-parallel workers as well, and so the
    nodes it spans (a split over more devices than a node holds is refused by the trainer's config check)."""
    from verl_omni.workers.config.rollout import DiffusionRolloutConfig
    from verl_omni.workers.rollout.vllm_omni.server import vLLMOmniReplica

    def replica(sp: int, gpus_per_node: int):
        config = DiffusionRolloutConfig(ulysses_sequence_parallel_size=sp)
        return vLLMOmniReplica(replica_rank=1, config=config, model_config=None, gpus_per_node=gpus_per_node)

    assert (replica(1, 8).world_size, replica(1, 8).nnodes) == (1, 1)
    split = replica(4, 8)
    assert (split.world_size, split.gpus_per_replica_node, split.nnodes) == (4, 4, 1)
    across = replica(4, 2)
    assert (across.world_size, across.gpus_per_replica_node, across.nnodes) == (4, 2, 2)

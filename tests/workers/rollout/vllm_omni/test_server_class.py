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


def test_a_failed_sleep_or_wake_up_ack_raises_naming_the_rank_and_the_fix():
    """vLLM-Omni's workers answer a failed wake-up with an ERROR ACK rather than raising; the server raises on it,
    before a weight load writes into memory that was never mapped back (the GPU test makes a real one fail)."""
    import pytest
    from vllm_omni.diffusion.data import OmniACK

    from verl_omni.workers.rollout.vllm_omni.server import failed_acks

    ok = OmniACK(task_id="t", status="SUCCESS", rank=0)
    failed_acks([ok, None], 0, "wake-up")
    failed_acks([], 0, "sleep")
    oom = OmniACK(task_id="t", status="ERROR", rank=0, error_msg="CUDA Error: out of memory at cumem_allocator.cpp")
    with pytest.raises(
        RuntimeError, match=r"replica 2: wake-up failed on rank 0: CUDA Error: out of memory.*param_offload"
    ):
        failed_acks([oom], 2, "wake-up")
    other = OmniACK(task_id="t", status="ERROR", rank=1, error_msg="bad tag")
    with pytest.raises(RuntimeError, match=r"replica 0: sleep failed on rank 1: bad tag$"):
        failed_acks([ok, other], 0, "sleep")
    # the worker's own failure path sends its ACK without a rank
    unranked = OmniACK(task_id="t", status="ERROR", error_msg="bad tag")
    with pytest.raises(RuntimeError, match=r"sleep failed on a worker: bad tag$"):
        failed_acks([unranked], 0, "sleep")

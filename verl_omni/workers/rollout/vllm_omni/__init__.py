"""vLLM-Omni rollout backend: registered lazily as rollout ``vllm_omni`` in verl's replica registry."""

from verl.workers.rollout.replica import RolloutReplicaRegistry

ROLLOUT_NAME = "vllm_omni"


def _load_vllm_omni_replica():
    from verl_omni.workers.rollout.vllm_omni.server import vLLMOmniReplica

    return vLLMOmniReplica


RolloutReplicaRegistry.register(ROLLOUT_NAME, _load_vllm_omni_replica)

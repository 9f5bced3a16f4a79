"""``vLLMOmniHttpServer`` as verl runs it: a Ray actor holding the real engine (CPU, tiny model)."""

from types import SimpleNamespace

import pytest
import torch
from lora_helpers import attention_lora

# above the engine start bound (engine_start_timeout_s, 1200 s): a start on a loaded machine may take most of it
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

SAMPLING = {"height": 32, "width": 32, "num_inference_steps": 3, "sde_window_size": 2, "seed": 11}


@pytest.fixture(scope="module")
def server(ray_driver, tiny_qwen_image_path):
    import ray
    from verl.workers.rollout.replica import RolloutMode

    from verl_omni.workers.config.rollout import DiffusionRolloutConfig
    from verl_omni.workers.rollout.vllm_omni.server import vLLMOmniHttpServer

    actor = (
        ray.remote(vLLMOmniHttpServer)
        .options(max_concurrency=8)
        .remote(
            config=DiffusionRolloutConfig(dtype="float32", height=32, width=32),
            model_config=SimpleNamespace(path=str(tiny_qwen_image_path)),
            rollout_mode=RolloutMode.STANDALONE,
            workers=[],
            replica_rank=0,
            node_rank=0,
            gpus_per_node=1,
            nnodes=1,
            cuda_visible_devices="",
        )
    )
    ray.get(actor.launch_server.remote())
    yield actor
    ray.get(actor.shutdown.remote())
    ray.kill(actor)


@pytest.fixture(scope="module")
def prompt_ids(tiny_qwen_image_path):
    from transformers import Qwen2Tokenizer

    from verl_omni.pipelines.qwen_image.rollout_request import prompt_token_ids

    tokenizer = Qwen2Tokenizer.from_pretrained(tiny_qwen_image_path, subfolder="tokenizer")
    return prompt_token_ids(tokenizer, "a green bird on a tree")


def test_server_generate_and_generate_batched(server, prompt_ids):
    import ray

    single = ray.get(server.generate.remote(prompt_ids, SAMPLING, "srv-1"))
    assert single.diffusion_output.shape == (3, 32, 32) and single.diffusion_output.dtype == torch.uint8
    assert single.rollout_log_probs.shape == (2,) and "negative_prompt_embeds" not in single.extra_fields
    batch = ray.get(server.generate_batched.remote(prompt_ids, SAMPLING, "srv-3", num_outputs_per_prompt=3))
    assert len(batch) == 3
    assert torch.equal(batch[0].diffusion_output, single.diffusion_output)
    with pytest.raises(ValueError, match="num_outputs_per_prompt"):
        ray.get(server.generate_batched.remote(prompt_ids, SAMPLING, "srv-0", num_outputs_per_prompt=0))


def test_server_sleep_and_wake_up_are_no_ops_on_cpu(server, prompt_ids):
    import ray

    before = ray.get(server.generate.remote(prompt_ids, SAMPLING, "srv-before-sleep"))
    ray.get(server.sleep.remote())
    ray.get(server.wake_up.remote())
    after = ray.get(server.generate.remote(prompt_ids, SAMPLING, "srv-after-wake"))
    assert torch.equal(before.diffusion_output, after.diffusion_output)


def test_lora_push_to_every_replica_changes_the_image_and_a_bad_one_names_the_server(server, prompt_ids):
    import asyncio

    import ray

    from verl_omni.workers.rollout.weight_sync import push_lora_to_replicas

    config, tensors = attention_lora(1.0, a_scale=1.0, seed=0)

    before = ray.get(server.generate.remote(prompt_ids, SAMPLING, "srv-before-lora"))
    bound = asyncio.run(push_lora_to_replicas([server, server], config, tensors))
    assert len(bound) == 2 and all(b > 0 for b in bound)
    after = ray.get(server.generate.remote(prompt_ids, SAMPLING, "srv-after-lora"))
    assert not torch.equal(before.diffusion_output, after.diffusion_output)

    bad = {k.replace("transformer_blocks", "no_such_blocks"): v for k, v in tensors.items()}
    with pytest.raises(RuntimeError, match="rollout server 0 of 1"):
        asyncio.run(push_lora_to_replicas([server], config, bad))
    with pytest.raises(ValueError, match="no rollout servers"):
        asyncio.run(push_lora_to_replicas([], config, tensors))


class OneRankGroup:
    """The worker-group surface ``RolloutWeightSync`` calls, over ``RankZero`` (ONE_TO_ALL: one result per rank; the
    non-blocking methods return object references)."""

    def __init__(self, rank):
        self.rank = rank

    def open_weight_group(self, size):
        import ray

        return [ray.get(self.rank.open.remote(size))]

    def join_weight_group(self):
        return [self.rank.connect.remote()]

    def stage_lora_params(self):
        import ray

        return [ray.get(self.rank.stage.remote())]

    def send_staged(self):
        return [self.rank.send.remote()]

    def release_shared(self):
        pass


def test_collective_lora_sync_over_ray_joins_the_servers_workers_and_binds(server, prompt_ids):
    """``RolloutWeightSync``'s collective transport between Ray actors (gloo on the CPU): the group joined by rank 0
    and the server's workers at once at the first sync, then the LoRA broadcast while the server receives it; the
    image is the host sync's."""
    import asyncio

    import ray

    from verl_omni.workers.rollout import weight_sync

    # defined here: Ray's workers take a class of a test module by value only (they cannot import the module)
    class RankZero:
        """Actor rank 0's end of the weight group in a Ray actor of its own, holding a LoRA: what
        ``DiffusionActorWorker``'s weight-group methods do on rank 0 (a one-rank stand-in for the FSDP worker group)."""

        def __init__(self, tensors, peft_config):
            self.tensors, self.peft_config, self.sender = tensors, peft_config, None

        def open(self, size):
            import ray

            from verl_omni.workers.rollout.collective_share import CollectiveSender

            self.sender = CollectiveSender(size, torch.device("cpu"), ray.util.get_node_ip_address())
            return self.sender.group

        def connect(self):
            self.sender.connect()

        def stage(self):
            return self.sender.stage(self.tensors), self.peft_config

        def send(self):
            return self.sender.send()

    config, tensors = attention_lora(1.0, a_scale=1.0, seed=1)
    asyncio.run(weight_sync.push_lora_to_replicas([server], config, tensors))
    host = ray.get(server.generate.remote(prompt_ids, SAMPLING, "srv-lora-host"))

    group = OneRankGroup(ray.remote(RankZero).remote(tensors, config))
    sync = weight_sync.RolloutWeightSync(group, [server], transport=weight_sync.COLLECTIVE, payload=weight_sync.LORA)
    metrics = sync.sync(step=1)
    sync.close()
    assert metrics["sync/weight_group_members"] == 2
    assert metrics["sync/lora_modules_bound_min"] > 0
    broadcast = ray.get(server.generate.remote(prompt_ids, SAMPLING, "srv-lora-broadcast"))
    assert torch.equal(broadcast.diffusion_output, host.diffusion_output)
    ray.kill(group.rank)

"""``vLLMOmniHttpServer`` as verl runs it: a Ray actor holding the real engine (CPU, tiny model)."""

from types import SimpleNamespace

import pytest
import torch

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

    gen = torch.Generator().manual_seed(0)
    tensors = {}
    for block in range(2):
        for proj in ("to_q", "to_k", "to_v"):
            prefix = f"base_model.model.transformer_blocks.{block}.attn.{proj}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(4, 64, generator=gen)
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(64, 4, generator=gen)
    config = {"r": 4, "lora_alpha": 4, "target_modules": ["to_q", "to_k", "to_v"]}

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

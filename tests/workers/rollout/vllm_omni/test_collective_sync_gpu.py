"""Weights between separate pools on CUDA: broadcast over NCCL from actor rank 0's end to the rollout's workers.

This process plays actor rank 0 on GPU 0 (``collective_share.CollectiveSender``, as ``DiffusionActorWorker`` holds
it); a bf16 rollout engine of the module's own runs on GPU 1 (its processes see that GPU alone), and its worker
joins the weight group through the worker extension's RPC, as a separate-pools run's replicas do. Each bucket's
layout goes to the engine while this process broadcasts its buffer, the two calls in flight together. The IPC
counterpart (one GPU) is ``test_rollout_engine_gpu.py``; the CPU run of the same path (gloo) is
``tests/workers/test_full_weight_sync.py``.
"""

import os

import pytest
import torch
from figures import figure
from lora_helpers import attention_lora
from test_rollout_engine_gpu import (
    BUCKET_BYTES,
    SAMPLING,
    ZERO_LORA_PIXEL_BOUND,
    base_and_perturbed_weights,
    prompt_ids,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        torch.cuda.device_count() < 2,
        reason="the NCCL weight sync between separate pools needs 2 GPUs (the actor's and the rollout's)",
    ),
]

# the rollout's GPU; this process (the actor's end) sends from GPU 0
ROLLOUT_GPU = 1


@pytest.fixture(scope="module")
def engine(loop, tiny_qwen_image_bf16_path):
    """A bf16 engine whose processes see only ``ROLLOUT_GPU`` (vLLM-Omni places its stages among the visible
    devices when it starts); this process keeps every GPU."""
    from verl_omni.workers.rollout.vllm_omni.engine import OmniRolloutEngine

    torch.cuda.init()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
    os.environ["CUDA_VISIBLE_DEVICES"] = gpus[ROLLOUT_GPU]
    rollout = OmniRolloutEngine(str(tiny_qwen_image_bf16_path), dtype="bfloat16", warmup_size=(64, 64))

    async def start():
        rollout.start()

    try:
        loop.run(start(), timeout=rollout.engine_start_timeout_s + 60)
    finally:
        if visible is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = visible
    yield rollout
    rollout.shutdown()


@pytest.fixture(scope="module")
def ids(tiny_qwen_image_bf16_path):
    return prompt_ids(tiny_qwen_image_bf16_path)


@pytest.fixture(scope="module")
def sender(loop, engine):
    """Actor rank 0's end of the weight group on GPU 0, joined with the engine's workers (NCCL)."""
    from verl_omni.workers.rollout.collective_share import CollectiveSender

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    own = CollectiveSender(1 + loop.run(engine.worker_count()), device, "127.0.0.1")
    assert own.group.backend == "nccl"
    joining = loop.submit(engine.join_weight_group(own.group, 1))
    own.connect()
    joining.result(600)
    return own


def _image(loop, engine, ids, request_id):
    prompt, negative = ids
    (out,) = loop.run(engine.engine_call(prompt, SAMPLING, request_id, negative_prompt_token_ids=negative))
    return out.diffusion_output


def _broadcast_bucket(loop, engine, sender, version, index, count, tensors, corrupt=False) -> int:
    from verl_omni.workers.rollout.weight_buckets import WeightBucket

    sent = sender.stage(tensors)
    if corrupt:
        sender.staged[-1][:64].add_(1)
    loading = loop.submit(engine.load_weight_bucket(WeightBucket.broadcast_build(version, index, count, sent)))
    sender.send()
    return loading.result(600)


def _broadcast_sync(loop, engine, sender, weights, version):
    """The separate-pools trainer's full-weight sync minus Ray: every bucket packed on GPU 0 and broadcast while the
    engine's worker receives it on GPU 1, checks and loads it."""
    from verl_omni.workers.rollout.weight_buckets import plan_buckets

    plan = plan_buckets(((n, t.numel() * t.element_size()) for n, t in weights.items()), BUCKET_BYTES)
    loop.run(engine.begin_weight_sync(version, len(plan)))
    for index, names in enumerate(plan):
        assert _broadcast_bucket(loop, engine, sender, version, index, len(plan), {n: weights[n] for n in names}) > 0
    return loop.run(engine.finish_weight_sync(version)), len(plan)


def test_full_weights_over_nccl_change_the_image_and_the_base_restores_it(
    loop, engine, sender, ids, tiny_qwen_image_bf16_path
):
    """Before any LoRA (a LoRA-wrapped engine refuses full weights): perturbed weights broadcast from GPU 0 move the
    image made on GPU 1, the checkpoint's own weights bring it back; a buffer changed after its checksum is refused."""
    from verl_omni.workers.rollout.weight_buckets import WeightSyncError

    base = _image(loop, engine, ids, "nccl-base")
    weights, moved = base_and_perturbed_weights(tiny_qwen_image_bf16_path, "cuda:0")
    report, buckets = _broadcast_sync(loop, engine, sender, moved, version=1)
    assert buckets > 1 and report["params"] > 0
    moved_diff = (_image(loop, engine, ids, "nccl-moved").int() - base.int()).abs().max().item()
    _broadcast_sync(loop, engine, sender, weights, version=2)
    back_diff = (_image(loop, engine, ids, "nccl-back").int() - base.int()).abs().max().item()
    # full weights over NCCL: max |pixel diff| against the base image, perturbed and restored
    figure("buckets", buckets)
    figure("pixel_diff_perturbed", moved_diff)
    figure("pixel_diff_restored", back_diff)
    assert moved_diff > 8 and back_diff <= ZERO_LORA_PIXEL_BOUND

    name = next(iter(weights))
    loop.run(engine.begin_weight_sync(3, 1))
    with pytest.raises(WeightSyncError, match="bucket 0 of weight sync 3: the broadcast weight buffer received is not"):
        _broadcast_bucket(loop, engine, sender, 3, 0, 1, {name: weights[name]}, corrupt=True)
    with pytest.raises(WeightSyncError, match="failed earlier"):
        loop.run(engine.finish_weight_sync(3))
    _broadcast_sync(loop, engine, sender, weights, version=4)


def test_lora_over_nccl_gives_the_host_syncs_image(loop, engine, sender, ids):
    """After the full-weight test (a LoRA wraps layers for good): the same adapter as host tensors and broadcast over
    NCCL makes the same image."""
    config, tensors = attention_lora(2.0)
    base = _image(loop, engine, ids, "nccl-lora-base")
    assert len(loop.run(engine.load_lora_tensors(config, tensors))) > 0
    host_image = _image(loop, engine, ids, "nccl-lora-host")
    sent = sender.stage({n: t.to("cuda:0") for n, t in tensors.items()})
    loading = loop.submit(engine.load_lora_tensors(config, broadcast=sent))
    sender.send()
    assert len(loading.result(600)) > 0
    nccl_image = _image(loop, engine, ids, "nccl-lora-broadcast")
    lora_diff = (host_image.int() - base.int()).abs().max().item()
    nccl_diff = (nccl_image.int() - host_image.int()).abs().max().item()
    # LoRA over NCCL vs the host sync, beside how far the LoRA itself moves the image
    figure("pixel_diff_nccl_vs_host", nccl_diff)
    figure("pixel_diff_lora", lora_diff)
    assert lora_diff > 8 and nccl_diff <= ZERO_LORA_PIXEL_BOUND
    loop.run(engine.clear_lora())

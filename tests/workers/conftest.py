"""Fixtures shared by the worker tests: a real vLLM-Omni rollout engine and a one-rank process group.

A module that asks for an engine or a gloo group starts one (an engine: tens of seconds on CPU) and
every test of the module reuses it; the fp32 Qwen-Image ``engine`` is shared by every module of
``tests/workers/`` (package scope: the modules leave it as they found it, no LoRA, base weights).
"""

import asyncio
import threading

import pytest


class LoopThread:
    """An event loop in a thread, so the async engine lives across tests of the module."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 600):
        return self.submit(coro).result(timeout)

    def submit(self, coro):
        """Start ``coro`` on the loop and return its future (a call this thread must meet while it runs)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)


@pytest.fixture(scope="package")
def loop():
    runner = LoopThread()
    yield runner
    runner.stop()


# the image size the worker tests generate at: the engines warm up at it too (one step)
TEST_IMAGE_SIZE = (32, 32)
# how much longer than the engine's own start bound the test waits for its start to return
START_MARGIN_S = 60


def _started_engine(loop, model_path, dtype, max_batch_requests: int = 8, **engine_kwargs):
    from verl_omni.workers.rollout.vllm_omni.engine import OmniRolloutEngine

    engine_kwargs.setdefault("warmup_size", TEST_IMAGE_SIZE)
    rollout = OmniRolloutEngine(str(model_path), dtype=dtype, max_batch_requests=max_batch_requests, **engine_kwargs)

    async def start():
        rollout.start()

    # the engine bounds its own start (engine_start_timeout_s) and says so; the loop only must not cut it short
    loop.run(start(), timeout=rollout.engine_start_timeout_s + START_MARGIN_S)
    return rollout


def _tokenized_prompts(model_path) -> dict:
    from transformers import Qwen2Tokenizer

    from verl_omni.pipelines.qwen_image.rollout_request import prompt_token_ids

    tokenizer = Qwen2Tokenizer.from_pretrained(model_path, subfolder="tokenizer")
    return {
        "cat": prompt_token_ids(tokenizer, "a red cat on a chair"),
        "dog": prompt_token_ids(tokenizer, "a blue dog near a tree"),
        "negative": prompt_token_ids(tokenizer, " "),
    }


@pytest.fixture(scope="package")
def engine(tiny_qwen_image_path, loop):
    """The rollout engine on the fp32 tiny model (CPU platform when no GPU), one for the package's modules."""
    rollout = _started_engine(loop, tiny_qwen_image_path, "float32")
    yield rollout
    rollout.shutdown()


@pytest.fixture(scope="module")
def own_engine(tiny_qwen_image_path, loop):
    """An fp32 engine of the module's own, for a module that needs one that never served a LoRA (vLLM-Omni keeps a
    LoRA's layer wrappers after the adapter is removed, and the package's ``engine`` serves LoRAs)."""
    rollout = _started_engine(loop, tiny_qwen_image_path, "float32")
    yield rollout
    rollout.shutdown()


@pytest.fixture(scope="module")
def bf16_engine(tiny_qwen_image_bf16_path, loop):
    """The rollout engine on the bf16 tiny model, as GPU engines run it."""
    rollout = _started_engine(loop, tiny_qwen_image_bf16_path, "bfloat16")
    yield rollout
    rollout.shutdown()


@pytest.fixture(scope="module")
def sleeping_bf16_engine(tiny_qwen_image_bf16_path, loop):
    """A bf16 engine with vLLM's sleep mode, as a colocated server starts it; the module's own (a failed wake-up
    leaves the weights' pool half mapped)."""
    rollout = _started_engine(loop, tiny_qwen_image_bf16_path, "bfloat16", enable_sleep_mode=True)
    yield rollout
    rollout.shutdown()


@pytest.fixture(scope="module")
def bagel_engine(tiny_bagel_path, loop):
    """The BAGEL DiT stage alone (CPU-capable); bf16, as vLLM-Omni's BAGEL generation path casts to it."""
    from verl_omni.pipelines.bagel import vllm_omni_deploy_config

    deploy = vllm_omni_deploy_config("bagel_single_stage")
    rollout = _started_engine(loop, tiny_bagel_path, "bfloat16", max_batch_requests=4, deploy_config=deploy)
    yield rollout
    rollout.shutdown()


@pytest.fixture(scope="module")
def thinker_dit_engine(tiny_bagel_bf16_path, loop):
    """BAGEL with its thinker and DiT stages (the thinker needs vLLM's CUDA engine)."""
    rollout = _started_engine(loop, tiny_bagel_bf16_path, "bfloat16", max_batch_requests=4)
    yield rollout
    rollout.shutdown()


@pytest.fixture(scope="module")
def prompts(tiny_qwen_image_path):
    return _tokenized_prompts(tiny_qwen_image_path)


def _process_group(backend: str):
    import torch.distributed as dist

    # one rank: an in-memory store (a port picked and released here could be taken before the store binds it)
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return dist


@pytest.fixture(scope="module")
def process_group():
    """A one-rank gloo process group in this process (what the engine's FSDP2 mesh needs)."""
    dist = _process_group("gloo")
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def cuda_process_group():
    """A one-rank NCCL process group on CUDA device 0."""
    import torch

    torch.cuda.set_device(0)
    dist = _process_group("nccl")
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="module", params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device_process_group(request):
    """The device a test runs on, with its one-rank group: gloo on the CPU, NCCL on CUDA device 0 (marked ``gpu``).

    Parametrized at module scope: pytest runs the module's CPU tests, tears the gloo group down, then the CUDA
    ones, so one test body covers both devices without two default groups at a time.
    """
    import torch

    if request.param == "cuda":
        torch.cuda.set_device(0)
    dist = _process_group("gloo" if request.param == "cpu" else "nccl")
    yield torch.device(request.param, 0) if request.param == "cuda" else torch.device("cpu")
    dist.destroy_process_group()

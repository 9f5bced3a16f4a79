"""Fixtures shared by the worker tests: a real vLLM-Omni rollout engine and a one-rank process group.

Both are module-scoped: a module that asks for them starts one engine (tens of seconds on CPU) or
one gloo group and every test of the module reuses it.
"""

import asyncio
import socket
import threading

import pytest


class LoopThread:
    """An event loop in a thread, so the async engine lives across tests of the module."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 600):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)


@pytest.fixture(scope="module")
def loop():
    runner = LoopThread()
    yield runner
    runner.stop()


@pytest.fixture(scope="module")
def engine(tiny_qwen_image_path, loop):
    from verl_omni.workers.rollout.vllm_omni.engine import OmniRolloutEngine

    rollout = OmniRolloutEngine(str(tiny_qwen_image_path), dtype="float32", max_batch_requests=8)

    async def start():
        rollout.start()

    loop.run(start())
    yield rollout
    rollout.shutdown()


@pytest.fixture(scope="module")
def prompts(tiny_qwen_image_path):
    from transformers import Qwen2Tokenizer

    from verl_omni.pipelines.qwen_image.rollout_request import prompt_token_ids

    tokenizer = Qwen2Tokenizer.from_pretrained(tiny_qwen_image_path, subfolder="tokenizer")
    return {
        "cat": prompt_token_ids(tokenizer, "a red cat on a chair"),
        "dog": prompt_token_ids(tokenizer, "a blue dog near a tree"),
        "negative": prompt_token_ids(tokenizer, " "),
    }


@pytest.fixture(scope="module")
def process_group():
    """A one-rank gloo process group in this process (what the engine's FSDP2 mesh needs)."""
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()

"""A real engine start on a busy CPU: the warm-up runs at the configured size, one step, and the start
completes beside a busy-loop process pinned to one core (no timing asserted: it must just not fail)."""

import os
import subprocess
import sys

import pytest
import torch

# above the engine start bound (engine_start_timeout_s, 1200 s): a start on a loaded machine may take most of it
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

# non-square, so the recorded warm-up shows height and width apart
WARMUP = (32, 48)
# the hog stops by itself after this long, should the test process die without stopping it
HOG_LIMIT_S = 900


@pytest.fixture(scope="module")
def cpu_hog():
    """A busy loop pinned to CPU 0 for the module's tests, stopped at teardown."""
    code = f"import time\nend = time.monotonic() + {HOG_LIMIT_S}\nwhile time.monotonic() < end:\n    pass\n"
    hog = subprocess.Popen([sys.executable, "-c", code], preexec_fn=lambda: os.sched_setaffinity(0, {0}))
    yield hog
    hog.terminate()
    hog.wait(timeout=30)


def test_engine_starts_beside_a_cpu_hog_and_warms_up_once_at_the_configured_size(
    cpu_hog, loop, tiny_qwen_image_path, prompts
):
    from verl_omni.platforms import cpu_patches
    from verl_omni.workers.rollout.vllm_omni.engine import OmniRolloutEngine

    warmups_before = len(cpu_patches.warmups_run())
    rollout = OmniRolloutEngine(str(tiny_qwen_image_path), dtype="float32", warmup_size=WARMUP)

    async def start():
        rollout.start()

    loop.run(start(), timeout=rollout.engine_start_timeout_s + 60)
    try:
        assert cpu_hog.poll() is None, "the CPU hog stopped before the engine had started"
        # the engine runs in this process (one stage, one replica): its warm-up is recorded here
        (warmup,) = cpu_patches.warmups_run()[warmups_before:]
        assert (warmup["height"], warmup["width"]) == WARMUP
        assert warmup["num_inference_steps"] == 1
        assert tuple(warmup["output_shape"][-2:]) == WARMUP
        params = {"height": WARMUP[0], "width": WARMUP[1], "num_inference_steps": 2, "sde_window_size": 1, "seed": 3}
        (out,) = loop.run(rollout.engine_call(prompts["cat"], params, "after-start"))
        assert out.diffusion_output.shape == (3, *WARMUP) and out.diffusion_output.dtype == torch.uint8
    finally:
        rollout.shutdown()

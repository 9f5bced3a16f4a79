"""The SD3.5 / FLUX.1 / Z-Image rollout pipelines on the real engine (CPU platform plugin, tiny random models, fp32).

One engine per model (module-scoped, parametrized): it runs the model's log-prob pipeline (a subclass
of vLLM-Omni's own, keeping its denoising loop) in spawned worker processes, as the rollout server
runs it. The actor side replays the recorded steps with the model's training adapter (the diffusers
transformer, ``workers/utils/replay.py``), as the trainer does.
"""

from __future__ import annotations

import pytest
import torch

H = W = 32
STEPS = 4
WINDOW = 2
NOISE = 0.7
# per model: the sampling settings beyond the shared ones (guidance the model's way)
MODELS = {
    "sd3": {"true_cfg_scale": 4.5},
    "flux": {"guidance_scale": 2.5},
    # Z-Image's CFG with both modifiers on: its truncation turns CFG off after normalised time 0.6
    "z_image": {"true_cfg_scale": 4.0, "model_kwargs": {"cfg_truncation": 0.6, "cfg_normalization": 1.0}},
}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=sorted(MODELS))
def model_name(request):
    return request.param


@pytest.fixture(scope="module")
def tiny_path(model_name, tiny_model):
    return tiny_model(model_name)


@pytest.fixture(scope="module")
def adapter(tiny_path):
    from verl_omni.pipelines.model_base import get_training_adapter

    return get_training_adapter(tiny_path)


@pytest.fixture(scope="module")
def model_engine(tiny_path, loop):
    from verl_omni.workers.rollout.vllm_omni.engine import OmniRolloutEngine

    # the engine warms up at the size the tests generate at (one step), not vLLM-Omni's 512²
    rollout = OmniRolloutEngine(str(tiny_path), dtype="float32", warmup_size=(H, W))

    async def start():
        rollout.start()

    loop.run(start())
    yield rollout
    rollout.shutdown()


@pytest.fixture(scope="module")
def prompt_ids(tiny_path, adapter):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_path, subfolder=adapter.tokenizer_subfolder)
    return {
        "cat": adapter.prompt_token_ids(tokenizer, "a red cat on a chair"),
        "negative": adapter.prompt_token_ids(tokenizer, "blurry"),
    }


def sampling(model_name, **overrides):
    base = {"height": H, "width": W, "num_inference_steps": STEPS, "noise_level": NOISE, "sde_window_size": WINDOW}
    return {**base, **MODELS[model_name], "seed": 7, **overrides}


def generate(loop, engine, model_name, prompt_ids, n=1, request_id="req", **overrides):
    params = sampling(model_name, **overrides)
    negative = prompt_ids["negative"] if params.get("true_cfg_scale", 1.0) > 1 else None
    return loop.run(engine.engine_call(prompt_ids["cat"], params, request_id, n, negative))


def test_images_finite_log_probs_and_the_adapters_conditioning(loop, model_engine, model_name, prompt_ids, adapter):
    (out,) = generate(loop, model_engine, model_name, prompt_ids, request_id="shape")
    assert out.diffusion_output.dtype == torch.uint8 and out.diffusion_output.shape == (3, H, W)
    assert int(out.diffusion_output.max()) > int(out.diffusion_output.min())
    assert out.rollout_log_probs.shape == (WINDOW,) and bool(torch.isfinite(out.rollout_log_probs).all())
    extra = out.extra_fields
    assert extra["all_latents"].ndim == 3 and extra["all_latents"].shape[0] == WINDOW + 1
    assert extra["all_timesteps"].shape == (WINDOW,)
    uses_cfg = MODELS[model_name].get("true_cfg_scale", 1.0) > 1
    assert set(adapter.required_keys(uses_cfg)) <= set(extra)


def test_seeds_reproduce_and_other_seeds_differ(loop, model_engine, model_name, prompt_ids):
    (a,) = generate(loop, model_engine, model_name, prompt_ids, request_id="seed-a")
    (b,) = generate(loop, model_engine, model_name, prompt_ids, request_id="seed-b")
    (c,) = generate(loop, model_engine, model_name, prompt_ids, request_id="seed-c", seed=8)
    assert torch.equal(a.diffusion_output, b.diffusion_output)
    assert torch.equal(a.rollout_log_probs, b.rollout_log_probs)
    assert not torch.equal(a.diffusion_output, c.diffusion_output)


@pytest.fixture(scope="module")
def batched(loop, model_engine, model_name, prompt_ids):
    return generate(loop, model_engine, model_name, prompt_ids, n=3, request_id="batched")


def test_batched_equals_per_sample(loop, model_engine, model_name, prompt_ids, batched):
    """Sample i of a batched request (seed 7 + i) is the single request with that seed, sample by sample."""
    for i, out in enumerate(batched):
        (alone,) = generate(loop, model_engine, model_name, prompt_ids, request_id=f"alone-{i}", seed=7 + i)
        assert (out.diffusion_output.int() - alone.diffusion_output.int()).abs().max() <= 1
        torch.testing.assert_close(out.rollout_log_probs, alone.rollout_log_probs, rtol=0, atol=1e-5)
        assert out.extra_fields["window_start"] == alone.extra_fields["window_start"]


def test_actor_replay_reproduces_the_rollouts_log_probs(model_name, adapter, tiny_path, batched):
    from verl_omni.pipelines.sampling import SamplingSpec
    from verl_omni.workers.utils.replay import check_replay_batch, prepare_scheduler, replay_step

    spec, _ = SamplingSpec.from_request_params(sampling(model_name), adapter)
    spec = spec.replay()
    batch = {k: torch.stack([o.extra_fields[k] for o in batched]) for k in ("all_latents", "all_timesteps")}
    batch |= {k: torch.stack([o.extra_fields[k] for o in batched]) for k in adapter.required_keys(spec.uses_cfg)}
    check_replay_batch(batch, spec, adapter)
    module = adapter.build_module(tiny_path).eval()
    scheduler = adapter.build_scheduler(tiny_path)
    prepare_scheduler(adapter, scheduler, spec, batch["all_latents"].shape[2])
    vae_scale = adapter.vae_scale_factor(tiny_path)
    with torch.no_grad():
        replayed = torch.stack(
            [replay_step(adapter, module, scheduler, batch, j, spec, vae_scale).log_prob for j in range(WINDOW)], dim=1
        )
    rollout = torch.stack([o.rollout_log_probs for o in batched])
    diff = float((replayed - rollout).abs().max())
    print(f"{model_name}: rollout vs actor replay max |log_prob diff| = {diff:.3e}")
    assert diff <= 1e-5

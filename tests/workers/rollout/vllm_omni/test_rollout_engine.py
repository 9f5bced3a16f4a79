"""The vLLM-Omni rollout on the real engine (CPU platform plugin, tiny random Qwen-Image).

One engine per module (fixtures in ``tests/workers/conftest.py``): it runs our log-prob pipeline
and worker extension in the engine's worker processes (forked on the CPU platform), exactly as the rollout
server runs it.
"""

import asyncio
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from lora_helpers import attention_lora

H = W = 32
STEPS = 4
WINDOW = 2
CFG = 4.0
NOISE = 0.7
SAMPLING = {
    "height": H,
    "width": W,
    "num_inference_steps": STEPS,
    "true_cfg_scale": CFG,
    "noise_level": NOISE,
    "sde_window_size": WINDOW,
    "seed": 7,
}

# above the engine start bound (engine_start_timeout_s, 1200 s): a start on a loaded machine may take most of it
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]


def generate(loop, engine, prompts, n=1, request_id="req", **overrides):
    params = {**SAMPLING, **overrides}
    return loop.run(
        engine.engine_call(
            prompts["cat"], params, request_id, num_outputs_per_prompt=n, negative_prompt_token_ids=prompts["negative"]
        )
    )


def test_generate_returns_image_log_probs_trajectory_and_embeds(loop, engine, prompts):
    (out,) = generate(loop, engine, prompts, request_id="shape")
    assert out.diffusion_output.dtype == torch.uint8 and out.diffusion_output.shape == (3, H, W)
    assert int(out.diffusion_output.max()) > int(out.diffusion_output.min())
    assert out.rollout_log_probs.shape == (WINDOW,) and bool(torch.isfinite(out.rollout_log_probs).all())
    extra = out.extra_fields
    assert extra["all_latents"].shape[0] == WINDOW + 1
    assert extra["all_timesteps"].shape == (WINDOW,)
    # the recorded timesteps are W consecutive, decreasing steps starting at the window start
    assert 0 <= extra["window_start"] <= STEPS - WINDOW
    assert bool((extra["all_timesteps"][1:] < extra["all_timesteps"][:-1]).all())
    assert extra["prompt_embeds"].ndim == 2 and extra["prompt_embeds_mask"].shape == extra["prompt_embeds"].shape[:1]
    assert "negative_prompt_embeds" in extra and "negative_prompt_embeds_mask" in extra


def _load_address(pid: int | str, library: str = "libtorch_cpu.so") -> int | None:
    """Where ``library`` is mapped in process ``pid`` (None: not mapped)."""
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        if line.endswith(library):
            return int(line.split("-", 1)[0], 16)
    return None


def test_the_engines_diffusion_workers_are_forks_of_this_process(engine):
    """On the CPU platform the engine forks its diffusion workers (``cpu_patches.patch_forked_workers``): they
    keep this process's memory layout, torch at the same address. A spawned worker is a new program whose
    libraries land at addresses of its own (address-space randomization). The workers are found as this
    process's children that loaded torch, not by their title (a forked worker's ``DiffusionWorker`` title did not
    always replace its parent's command line: seen in the model benchmark's test, which sets an environment variable)."""
    import psutil

    assert Path("/proc/sys/kernel/randomize_va_space").read_text().strip() != "0", "needs ASLR to tell them apart"
    addresses = [_load_address(child.pid) for child in psutil.Process().children()]
    workers = [address for address in addresses if address is not None]
    assert workers, "no child of this process loaded torch: where is the engine's diffusion worker?"
    assert workers == [_load_address("self")] * len(workers)


def test_same_seed_same_image_other_seed_other_image(loop, engine, prompts):
    (a,) = generate(loop, engine, prompts, request_id="seed-a")
    (b,) = generate(loop, engine, prompts, request_id="seed-b")
    (c,) = generate(loop, engine, prompts, request_id="seed-c", seed=8)
    assert torch.equal(a.diffusion_output, b.diffusion_output)
    assert torch.equal(a.rollout_log_probs, b.rollout_log_probs)
    assert not torch.equal(a.diffusion_output, c.diffusion_output)


def test_generate_batched_gives_distinct_samples_and_n1_matches_generate(loop, engine, prompts):
    outs = generate(loop, engine, prompts, n=4, request_id="batched-4")
    assert len(outs) == 4
    images = [o.diffusion_output for o in outs]
    assert all(not torch.equal(images[i], images[j]) for i in range(4) for j in range(i + 1, 4))
    (single,) = generate(loop, engine, prompts, n=1, request_id="batched-1")
    (plain,) = generate(loop, engine, prompts, request_id="plain")
    assert single.diffusion_output.shape == plain.diffusion_output.shape
    assert single.rollout_log_probs.shape == plain.rollout_log_probs.shape
    assert {k: tuple(getattr(v, "shape", ())) for k, v in single.extra_fields.items()} == {
        k: tuple(getattr(v, "shape", ())) for k, v in plain.extra_fields.items()
    }
    # sample 0 of a batched request uses the request seed, as generate does
    assert torch.equal(outs[0].diffusion_output, plain.diffusion_output)


def test_zero_outputs_per_prompt_raises_before_the_engine_sees_a_request(loop, engine, prompts):
    before = loop.run(engine.request_batch_sizes())
    with pytest.raises(ValueError, match="num_outputs_per_prompt"):
        generate(loop, engine, prompts, n=0, request_id="n0")
    assert loop.run(engine.request_batch_sizes()) == before


def test_a_request_past_the_generation_bound_is_aborted_and_named(loop, engine, prompts, monkeypatch):
    """The request's output, should it reach the engine's result pump first, is held there until the request is
    aborted: the request runs past its bound by an event, not by a bound tighter than the engine's batching wait
    and denoising (an abort while the request waits to be batched is the other order, and passes as well)."""
    from vllm_omni.diffusion.executor import multiproc_executor

    held, aborting = threading.Event(), threading.Event()
    unpack, abort = multiproc_executor.unpack_diffusion_output_shm, engine.abort

    def pump_unpack(output):
        if threading.current_thread().name == "DiffusionResultPump" and not held.is_set():
            held.set()
            aborting.wait(HANDOVER_WAIT_S)
        return unpack(output)

    async def abort_and_release(request_ids):
        aborting.set()  # before the abort is awaited: an abort that needed the pump would otherwise wait on it
        await abort(request_ids)

    monkeypatch.setattr(multiproc_executor, "unpack_diffusion_output_shm", pump_unpack)
    monkeypatch.setattr(engine, "abort", abort_and_release)
    monkeypatch.setattr(engine, "generation_timeout_s", 0.05)
    try:
        with pytest.raises(TimeoutError, match=r"request late .*rollout\.generation_timeout_s=0\.05 s.*aborted"):
            generate(loop, engine, prompts, n=2, request_id="late")
    finally:
        aborting.set()
    monkeypatch.undo()
    # the aborted request left nothing behind: the next one runs and matches the same seed's earlier image
    (again,) = generate(loop, engine, prompts, request_id="after-late")
    (first,) = generate(loop, engine, prompts, request_id="after-late-2")
    assert torch.equal(again.diffusion_output, first.diffusion_output)


# how long either side of the forced interleaving below waits for the other (the test's bound, never a delay)
HANDOVER_WAIT_S = 120.0


def test_an_output_ready_before_its_request_waits_for_it_still_reaches_the_request(loop, engine, prompts, monkeypatch):
    """vLLM-Omni's result pump, given a finished request's output, looks for the request's waiter and, finding none,
    parks the output in a second step; a request that registers its waiter between the two steps got nothing and hung
    until ``generation_timeout_s`` (gap ``async_output_handover``, ``utils/vllm_omni_compat.py``). The interleaving,
    rare on its own (a busy machine's thread switch inside the pump), is forced here on the real engine (its stage
    and result pump run in this process) by two events, not by the clock: the request's waiter registers only once
    the pump has found none, and the pump parks the output only once the waiter is registered."""
    from vllm_omni.diffusion.executor import multiproc_executor

    pump_found_no_waiter, waiter_registered = threading.Event(), threading.Event()
    unpack = multiproc_executor.unpack_diffusion_output_shm
    wait_output_ready = multiproc_executor.MultiprocDiffusionExecutor.wait_output_ready

    def pump_unpack(output):
        # the pump unpacks an output between finding no waiter for it and parking it
        if threading.current_thread().name == "DiffusionResultPump" and not pump_found_no_waiter.is_set():
            pump_found_no_waiter.set()
            waiter_registered.wait(HANDOVER_WAIT_S)
        return unpack(output)

    def late_waiter(executor, output_id):
        pump_found_no_waiter.wait(HANDOVER_WAIT_S)
        future = wait_output_ready(executor, output_id)
        waiter_registered.set()
        return future

    monkeypatch.setattr(multiproc_executor, "unpack_diffusion_output_shm", pump_unpack)
    monkeypatch.setattr(multiproc_executor.MultiprocDiffusionExecutor, "wait_output_ready", late_waiter)
    monkeypatch.setattr(engine, "generation_timeout_s", HANDOVER_WAIT_S)
    (out,) = generate(loop, engine, prompts, request_id="late-waiter")
    assert pump_found_no_waiter.is_set() and waiter_registered.is_set()
    assert out.diffusion_output.shape == (3, H, W) and out.rollout_log_probs.shape == (WINDOW,)


def test_concurrent_requests_share_transformer_batches(loop, engine, prompts):
    before = len(loop.run(engine.request_batch_sizes()))
    omni = engine.engine  # vLLM-Omni's AsyncOmni: while paused, its generate() holds each request at the door

    async def burst():
        # the four group requests of an agent-loop worker, all submitted before any reaches the engine, then let
        # through together: ordered by the pause, not by the clock
        await omni.pause_generation(clear_cache=False)
        try:
            calls = [
                asyncio.ensure_future(
                    engine.engine_call(
                        prompts["cat"], {**SAMPLING, "seed": 100 + i}, f"burst-{i}", 1, prompts["negative"]
                    )
                )
                for i in range(4)
            ]
            await asyncio.sleep(0)  # one turn of the loop: each call runs up to the paused door
            assert not any(call.done() for call in calls), [call.result() for call in calls if call.done()]
        finally:
            await omni.resume_generation()
        return await asyncio.gather(*calls)

    results = loop.run(burst())
    assert len(results) == 4
    batches = loop.run(engine.request_batch_sizes())[before:]
    # the engine waits for queued requests before a batch (DEFAULT_BATCH_WAIT_MS): all four join one
    assert batches == [4], f"4 concurrent requests ran in transformer batches {batches}"


def _schedule(model_path, image_seq_len):
    """The rollout's schedule rebuilt on the training side: Qwen-Image sigmas with its dynamic shift."""
    from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift

    from verl_omni.pipelines.schedulers.flow_match_sde import FlowMatchSDEDiscreteScheduler

    scheduler = FlowMatchSDEDiscreteScheduler.from_pretrained(model_path, subfolder="scheduler")
    cfg = scheduler.config
    mu = calculate_shift(image_seq_len, cfg.base_image_seq_len, cfg.max_image_seq_len, cfg.base_shift, cfg.max_shift)
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / STEPS, STEPS), mu=mu)
    return scheduler


def _replay_max_diff(outs, model_path, sde_type="sde", noise=NOISE) -> float:
    """Max |log π| gap between each recorded step and its replay by the diffusers transformer (the actor's step)."""
    from verl_omni.pipelines.qwen_image.training_adapter import PromptEmbeds, QwenImageTrainingAdapter
    from verl_omni.pipelines.schedulers.flow_match_sde import sde_step_with_logprob

    transformer = QwenImageTrainingAdapter.load_transformer(model_path, dtype=torch.float32).eval()
    scheduler = _schedule(model_path, outs[0].extra_fields["all_latents"].shape[1])
    latent_side = H // 4  # VAE scale factor 4 for the tiny model (two temporal-downsample entries)
    img_shapes = QwenImageTrainingAdapter.img_shapes(1, latent_side, latent_side)

    max_diff = 0.0
    for out in outs:
        extra = out.extra_fields
        positive = PromptEmbeds(extra["prompt_embeds"][None], extra["prompt_embeds_mask"][None])
        negative = PromptEmbeds(extra["negative_prompt_embeds"][None], extra["negative_prompt_embeds_mask"][None])
        for k in range(len(out.rollout_log_probs)):
            x = extra["all_latents"][k][None]
            t = extra["all_timesteps"][k][None]
            with torch.no_grad():
                v = QwenImageTrainingAdapter.predict_velocity(
                    transformer, x, t, positive, img_shapes, negative=negative, true_cfg_scale=CFG
                )
                step = sde_step_with_logprob(
                    scheduler,
                    v,
                    t,
                    x,
                    noise_level=noise,
                    prev_sample=extra["all_latents"][k + 1][None],
                    sde_type=sde_type,
                )
            max_diff = max(max_diff, float((step.log_prob[0] - out.rollout_log_probs[k]).abs()))
    return max_diff


def test_recorded_log_probs_are_reproduced_by_the_diffusers_transformer(loop, engine, prompts, tiny_qwen_image_path):
    outs = generate(loop, engine, prompts, n=2, request_id="replay")
    max_diff = _replay_max_diff(outs, tiny_qwen_image_path)
    print(f"rollout vs diffusers replay: max |log_prob diff| = {max_diff:.3e}")
    # measured 1.2e-07 on CPU fp32; the issue allows 1e-4
    assert max_diff <= 1e-5


def test_dance_grpo_and_mix_grpo_flash_samplers_on_the_engine(loop, engine, prompts, tiny_qwen_image_path):
    # DanceGRPO: every step stochastic, one initial noise for the group
    dance = {"sde_type": "dance", "noise_level": 0.3, "sde_window_size": STEPS, "seeds": [7, 8]}
    outs = generate(loop, engine, prompts, n=2, request_id="dance", **dance, initial_noise_seeds=[7, 7])
    first, second = (o.extra_fields["all_latents"] for o in outs)
    assert torch.equal(first[0], second[0]) and not torch.equal(first[1], second[1])
    assert not torch.equal(outs[0].diffusion_output, outs[1].diffusion_output)
    dance_diff = _replay_max_diff(outs, tiny_qwen_image_path, "dance", 0.3)

    # MixGRPO-Flash: the window [0, 2) of training step 1, then DPM-Solver++ on 1 step instead of 2
    mix = {"sde_window_schedule": "progressive", "global_step": 1, "seeds": [7, 8]}
    flash = generate(
        loop, engine, prompts, n=2, request_id="flash", **mix, ode_solver="dpmsolver++", ode_post_window_ratio=0.5
    )
    plain = generate(loop, engine, prompts, n=2, request_id="mix", **mix)
    for f, p in zip(flash, plain, strict=True):
        assert f.extra_fields["window_start"] == 0 and torch.equal(f.rollout_log_probs, p.rollout_log_probs)
        assert torch.equal(f.extra_fields["all_latents"], p.extra_fields["all_latents"])
        assert not torch.equal(f.diffusion_output, p.diffusion_output)  # the post-window ODE differs
    flash_diff = _replay_max_diff(flash, tiny_qwen_image_path)
    print(f"rollout vs diffusers replay: dance {dance_diff:.3e}, MixGRPO-Flash {flash_diff:.3e}")
    assert dance_diff <= 1e-5 and flash_diff <= 1e-5


def test_random_windows_thin_the_ode_after_the_window_range_and_record_the_unthinned_windows(loop, engine, prompts):
    """6 steps, random windows of 2 in [0, 3): steps 3..5 run as one DPM-Solver++ step; every sample's window (at
    a seeded, per-sample step) and its log-probs are the unthinned rollout's, bit for bit; the image differs."""
    values = {"num_inference_steps": 6, "sde_window_range": [0, 3], "seeds": [7, 8, 9]}
    thinned = generate(
        loop, engine, prompts, n=3, request_id="thin", **values, ode_solver="dpmsolver++", ode_post_window_ratio=0.5
    )
    plain = generate(loop, engine, prompts, n=3, request_id="unthinned", **values)
    assert len({p.extra_fields["window_start"] for p in plain}) > 1
    for t, p in zip(thinned, plain, strict=True):
        assert torch.equal(t.rollout_log_probs, p.rollout_log_probs)
        for key in ("all_latents", "all_timesteps", "window_start"):
            assert torch.equal(torch.as_tensor(t.extra_fields[key]), torch.as_tensor(p.extra_fields[key])), key
        assert not torch.equal(t.diffusion_output, p.diffusion_output)


@pytest.fixture
def lora_cleanup(loop, engine):
    yield
    loop.run(engine.clear_lora())


def test_lora_push_changes_the_image_and_zero_lora_restores_it_exactly(loop, engine, prompts, lora_cleanup):
    (base,) = generate(loop, engine, prompts, request_id="lora-base")
    config, tensors = attention_lora(scale=2.0)
    bound = loop.run(engine.load_lora_tensors(config, tensors))
    assert len(bound) == 2  # the fused to_qkv of both blocks
    (adapted,) = generate(loop, engine, prompts, request_id="lora-on")
    assert not torch.equal(adapted.diffusion_output, base.diffusion_output)

    zero_config, zero_tensors = attention_lora(scale=0.0)
    loop.run(engine.load_lora_tensors(zero_config, zero_tensors))
    (restored,) = generate(loop, engine, prompts, request_id="lora-zero")
    assert torch.equal(restored.diffusion_output, base.diffusion_output)
    assert torch.equal(restored.rollout_log_probs, base.rollout_log_probs)


def test_lora_whose_names_match_no_module_or_only_some_fails_loudly(loop, engine, prompts, lora_cleanup):
    tensors = {
        "base_model.model.not_a_block.0.proj.lora_A.weight": torch.ones(4, 64),
        "base_model.model.not_a_block.0.proj.lora_B.weight": torch.ones(64, 4),
    }
    with pytest.raises(ValueError, match="binds no module"):
        loop.run(engine.load_lora_tensors({"r": 4, "lora_alpha": 4, "target_modules": ["proj"]}, tensors))
    assert engine.active_lora is None

    config, partial = attention_lora(scale=1.0)
    partial.update(tensors)
    with pytest.raises(ValueError, match="weights that bind no module"):
        loop.run(engine.load_lora_tensors(config, partial))
    assert engine.active_lora is None
    (out,) = generate(loop, engine, prompts, request_id="after-bad-lora")
    assert out.diffusion_output.shape == (3, H, W)

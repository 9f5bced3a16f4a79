"""The SD3.5 / FLUX.1 / FLUX.2-dev / FLUX.2-klein / Z-Image / Wan2.2 (text-to-video, I2V-A14B) / HunyuanVideo-1.5 / LTX-2 (video with audio) / Qwen-Image-Edit / FLUX.1-Kontext rollout pipelines on the real engine (CPU platform plugin, tiny random models, fp32).

One engine per model (module-scoped, parametrized): it runs the model's log-prob pipeline (a subclass
of vLLM-Omni's own, keeping its denoising loop) in spawned worker processes, as the rollout server
runs it. The actor side replays the recorded steps with the model's training adapter (the diffusers
transformer, ``workers/utils/replay.py``), as the trainer does, also after a LoRA sync.
"""

from __future__ import annotations

import pytest
import torch
from diffusers_helpers import (
    random_lora_module,
    replay_log_probs,
    source_image,
    source_images,
    start_engine,
    tokenized_prompt,
)
from sequence_parallel_helpers import SPLIT_DEGREE, check_split_replica

H = W = 32
STEPS = 4
WINDOW = 2
NOISE = 0.7
# per model: the sampling settings beyond the shared ones (guidance the model's way)
MODELS = {
    "sd3": {"true_cfg_scale": 4.5},
    "flux": {"guidance_scale": 2.5},
    # FLUX.2-dev's guidance embedded too
    "flux2": {"guidance_scale": 2.5},
    # the base klein's classic CFG (the step-distilled one refuses it)
    "flux2_klein": {"true_cfg_scale": 4.0},
    "flux2_klein_distilled": {},
    # Z-Image's CFG with both modifiers on: its truncation turns CFG off after normalised time 0.6
    "z_image": {"true_cfg_scale": 4.0, "model_kwargs": {"cfg_truncation": 0.6, "cfg_normalization": 1.0}},
    # a video of 5 frames (two latent frames), two latent patches across (the rotary embedding's width positions)
    "wan2_2": {"true_cfg_scale": 4.0, "num_frames": 5, "width": 2 * W},
    # the two experts (4 steps: timesteps 1000 and 937.5 are the high-noise expert's, 833 and 625 the other's), the
    # source image (40x24) resized to the video's first frame
    "wan2_2_i2v_a14b": {"true_cfg_scale": 3.5, "num_frames": 5},
    # video and audio denoised as one latent (2 latent frames of 1x2 cells, then the audio tokens); the release's
    # per-stream CFG scales (video 3, audio 7)
    "ltx2": {"true_cfg_scale": 3.0, "num_frames": 9, "width": 2 * W, "model_kwargs": {"audio_cfg_scale": 7.0}},
    # HunyuanVideo-1.5: two latent frames of 2x4 latent cells (1x1 patches); image to video: the source image resized
    # to the first frame, its SigLIP states and first-frame latents recorded
    "hunyuan_video_1_5": {"true_cfg_scale": 6.0, "num_frames": 5, "width": 2 * W},
    "hunyuan_video_1_5_i2v": {"true_cfg_scale": 6.0, "num_frames": 5},
    # the source image conditioned at 32² (the stock 1024² is 16k tokens on the tiny 4x VAE)
    "qwen_image_edit": {"true_cfg_scale": 4.0, "model_kwargs": {"condition_area": 32 * 32}},
    # two source images (the second square), each read by the vision tower at 32² too (the stock 384²)
    "qwen_image_edit_plus": {
        "true_cfg_scale": 4.0,
        "model_kwargs": {"condition_area": 32 * 32, "vl_condition_area": 32 * 32},
    },
    # the source image conditioned at its own size (40x24, a grid unlike the output's), the guidance embedded
    "flux_kontext": {"guidance_scale": 2.5},
}
# the models with sound: the vocoder's channels and rate (the tiny LTX-2's is the release's stereo 24 kHz)
AUDIO = {"ltx2": (2, 24_000)}
# the prompt a model samples, where not "a red cat on a chair": HunyuanVideo-1.5's quotes a text, which its glyph
# encoder (ByT5) reads (a prompt without quotes leaves that stream empty)
PROMPTS = {
    name: 'a red cat on a chair, a sign that says "OK"' for name in ("hunyuan_video_1_5", "hunyuan_video_1_5_i2v")
}
# the editing models whose prompt embeddings read the source image too (Qwen2.5-VL); FLUX.1-Kontext's are text only
IMAGE_IN_PROMPT = ("qwen_image_edit", "qwen_image_edit_plus")
# the models whose tests below run on a subset (each a capability of the adapter; the first test checks the lists
# against the adapters, so a model added with the capability is not left out of its test)
SOURCE_IMAGE_MODELS = (
    "flux_kontext",
    "hunyuan_video_1_5_i2v",
    "qwen_image_edit",
    "qwen_image_edit_plus",
    "wan2_2_i2v_a14b",
)
SPLIT_ROLLOUT_MODELS = ("flux2_klein", "flux2_klein_distilled", "wan2_2", "wan2_2_i2v_a14b")
# the text encoder is vLLM-Omni's own Mistral (FLUX.2-dev)
MISTRAL_TEXT_MODELS = ("flux2",)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=sorted(MODELS))
def model_name(request):
    return request.param


@pytest.fixture(scope="module")
def tiny_path(model_name, tiny_model):
    return tiny_model(model_name)


@pytest.fixture(scope="module")
def adapter(tiny_path):
    from verl_omni.pipelines.model_base import get_model_adapter

    return get_model_adapter(tiny_path)


@pytest.fixture(scope="module")
def model_engine(tiny_path, loop):
    rollout = start_engine(loop, tiny_path, "float32", (H, W))
    yield rollout
    rollout.shutdown()


@pytest.fixture(scope="module")
def prompt_ids(model_name, tiny_path, adapter):
    return {
        "cat": tokenized_prompt(tiny_path, adapter, PROMPTS.get(model_name, "a red cat on a chair")),
        "negative": tokenized_prompt(tiny_path, adapter, "blurry"),
    }


def sampling(model_name, **overrides):
    base = {"height": H, "width": W, "num_inference_steps": STEPS, "noise_level": NOISE, "sde_window_size": WINDOW}
    return {**base, **MODELS[model_name], "seed": 7, **overrides}


def generate(loop, engine, model_name, prompt_ids, n=1, request_id="req", lora_request=None, image=None, **overrides):
    """One request; an editing model's carries ``image`` (default :func:`source_image`) and, for a multi-image
    model, a second, square source image."""
    params = sampling(model_name, **overrides)
    negative = prompt_ids["negative"] if params.get("true_cfg_scale", 1.0) > 1 else None
    images = source_images(engine.adapter, image)
    return loop.run(
        engine.engine_call(prompt_ids["cat"], params, request_id, n, negative, lora_request, image_data=images)
    )


def test_images_finite_log_probs_and_the_adapters_conditioning(loop, model_engine, model_name, prompt_ids, adapter):
    (out,) = generate(loop, model_engine, model_name, prompt_ids, request_id="shape")
    params = sampling(model_name)
    frames, size = params.get("num_frames", 1), (3, params["height"], params["width"])
    # an image [3, H, W]; a video [F, 3, H, W]
    expected = size if frames == 1 else (frames, *size)
    assert out.diffusion_output.dtype == torch.uint8 and out.diffusion_output.shape == expected
    assert int(out.diffusion_output.max()) > int(out.diffusion_output.min())
    if model_name in AUDIO:
        channels, rate = AUDIO[model_name]
        assert out.audio_sample_rate == rate and out.audio.dtype == torch.float32
        # the vocoder's 240 samples per mel frame (100 mel frames a second at 24 kHz)
        assert out.audio.shape[0] == channels and out.audio.shape[1] % 240 == 0 and out.audio.shape[1] > 0
        assert float(out.audio.abs().max()) <= 1.0 and float(out.audio.std()) > 0
    else:
        assert out.audio is None and out.audio_sample_rate is None
    assert out.rollout_log_probs.shape == (WINDOW,) and bool(torch.isfinite(out.rollout_log_probs).all())
    extra = out.extra_fields
    assert extra["all_latents"].ndim == 1 + adapter.latent_ndim and extra["all_latents"].shape[0] == WINDOW + 1
    assert extra["all_timesteps"].shape == (WINDOW,)
    uses_cfg = MODELS[model_name].get("true_cfg_scale", 1.0) > 1
    assert set(adapter.required_keys(uses_cfg)) <= set(extra)
    assert bool(adapter.max_source_images) == (model_name in SOURCE_IMAGE_MODELS)
    assert adapter.rollout_supports_sequence_parallel == (model_name in SPLIT_ROLLOUT_MODELS)


def test_seeds_reproduce_and_other_seeds_differ(loop, model_engine, model_name, prompt_ids):
    (a,) = generate(loop, model_engine, model_name, prompt_ids, request_id="seed-a")
    (b,) = generate(loop, model_engine, model_name, prompt_ids, request_id="seed-b")
    (c,) = generate(loop, model_engine, model_name, prompt_ids, request_id="seed-c", seed=8)
    assert torch.equal(a.diffusion_output, b.diffusion_output)
    assert torch.equal(a.rollout_log_probs, b.rollout_log_probs)
    assert not torch.equal(a.diffusion_output, c.diffusion_output)


@pytest.mark.parametrize("model_name", SOURCE_IMAGE_MODELS, indirect=True)
def test_the_source_image_changes_the_edit(loop, model_engine, model_name, prompt_ids, adapter):
    """An editing model's output depends on its source image (same seed, another image: another edit), and a
    request without one is refused naming the request."""
    (a,) = generate(loop, model_engine, model_name, prompt_ids, request_id="src-a")
    (b,) = generate(loop, model_engine, model_name, prompt_ids, request_id="src-b", image=source_image(1))
    assert not torch.equal(a.diffusion_output, b.diffusion_output)
    source_keys = [k for k in adapter.conditioning_keys if not k.startswith("prompt_embeds")]
    assert any(not torch.equal(a.extra_fields[k], b.extra_fields[k]) for k in source_keys), source_keys
    same_prompt = torch.equal(a.extra_fields["prompt_embeds"], b.extra_fields["prompt_embeds"])
    assert same_prompt == (model_name not in IMAGE_IN_PROMPT)
    params = sampling(model_name)
    negative = prompt_ids["negative"] if params.get("true_cfg_scale", 1.0) > 1 else None
    with pytest.raises(ValueError, match="request no-src has 0 source images"):
        loop.run(model_engine.engine_call(prompt_ids["cat"], params, "no-src", 1, negative))


@pytest.mark.parametrize("model_name", MISTRAL_TEXT_MODELS, indirect=True)
def test_mistral_prompt_embeds_are_diffusers_on_the_prompts_tokens(
    loop, model_engine, model_name, prompt_ids, tiny_path
):
    """FLUX.2-dev's text encoder is vLLM-Omni's own Mistral (not transformers'): on the templated prompt's tokens the
    recorded embeddings are diffusers' ``Flux2Pipeline.encode_prompt``'s (the RoPE base read from the config,
    ``vllm_omni_compat.mistral_encoder_rope_theta``). Its padding rows differ: vLLM-Omni numbers the padding's
    positions from the attention mask, transformers by index."""
    from diffusers import Flux2Pipeline
    from diffusers.pipelines.flux2.pipeline_flux2 import format_input

    (out,) = generate(loop, model_engine, model_name, prompt_ids, request_id="embeds")
    pipe = Flux2Pipeline.from_pretrained(tiny_path)
    text = pipe.tokenizer.decode(prompt_ids["cat"], skip_special_tokens=True)
    tokens = len(
        pipe.tokenizer.apply_chat_template(format_input([text]), tokenize=True, return_dict=True)["input_ids"][0]
    )
    with torch.no_grad():
        expected = pipe.encode_prompt([text], device="cpu")[0][0]
    recorded = torch.as_tensor(out.extra_fields["prompt_embeds"]).float()
    assert recorded.shape == expected.shape and 20 < tokens < expected.shape[0]
    torch.testing.assert_close(recorded[:tokens], expected[:tokens], rtol=0, atol=1e-5)


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
    replayed = replay_log_probs(adapter, tiny_path, batched, sampling(model_name))
    rollout = torch.stack([o.rollout_log_probs for o in batched])
    assert replayed.shape == rollout.shape == (len(batched), WINDOW)
    diff = float((replayed - rollout).abs().max())
    print(f"{model_name}: rollout vs actor replay max |log_prob diff| = {diff:.3e}")
    assert diff <= 1e-5


def test_random_windows_thin_the_ode_after_the_window_range_and_record_the_unthinned_windows(
    loop, model_engine, model_name, prompt_ids
):
    """The model's denoising loop follows ``recorder.loop_timesteps``: with random windows of 2 in [0, 2) of 6
    steps, steps 2..5 run as one DPM-Solver++ step (three model calls fewer), and the recorded window is the
    unthinned rollout's, bit for bit; the output differs. (6 steps, not 4: Z-Image's last step is σ 0 → 0, so
    at 4 steps the thinned and the plain ODE both end at step 2's data prediction.)"""
    values = {"num_inference_steps": 6, "sde_window_range": [0, WINDOW]}
    thin = {"ode_solver": "dpmsolver++", "ode_post_window_ratio": 0.5}
    (thinned,) = generate(loop, model_engine, model_name, prompt_ids, request_id="thin", **values, **thin)
    (plain,) = generate(loop, model_engine, model_name, prompt_ids, request_id="unthinned", **values)
    assert torch.equal(thinned.rollout_log_probs, plain.rollout_log_probs)
    for key in ("all_latents", "all_timesteps", "window_start"):
        assert torch.equal(torch.as_tensor(thinned.extra_fields[key]), torch.as_tensor(plain.extra_fields[key])), key
    assert not torch.equal(thinned.diffusion_output, plain.diffusion_output)


# rollout layers a LoRA on the adapter's default targets binds in the tiny model: q/k/v land on the fused
# to_qkv (and the context stream's on add_kv_proj); SD3.5 block 0 also has attn2, its last block no to_add_out
# Wan2.2: per block, the self-attention's fused to_qkv and to_out, the cross-attention's to_q, to_k, to_v, to_out
LORA_LAYERS = {
    "sd3": 9,
    "flux": 5,
    "flux2": 4,
    "flux2_klein": 4,
    "flux2_klein_distilled": 4,
    "z_image": 8,
    "wan2_2": 12,
    # both experts (two blocks and one)
    "wan2_2_i2v_a14b": 18,
    # per block: the video self-attention's fused to_qkv and its to_out, and to_q, to_k, to_v, to_out of the audio
    # self-attention (unfused), the video and audio text cross-attentions, the audio-to-video and video-to-audio ones
    "ltx2": 44,
    # per block: the self-attention's fused to_qkv and to_out.0, the context stream's fused add_kv_proj, to_add_out
    "hunyuan_video_1_5": 8,
    "hunyuan_video_1_5_i2v": 8,
    "qwen_image_edit": 8,
    "qwen_image_edit_plus": 8,
    "flux_kontext": 5,
}


@pytest.fixture(scope="module")
def lora_module(adapter, tiny_path):
    """The adapter's diffusers transformer with a random LoRA (rank 4, alpha 8) on the adapter's default targets."""
    return random_lora_module(adapter, tiny_path)


@pytest.fixture(scope="module")
def synced(loop, model_engine, model_name, prompt_ids, adapter, lora_module):
    """The base sample, then 2 samples with ``lora_module``'s LoRA pushed in memory in the adapter's rollout form
    (``rollout_lora``, as the trainer pushes it), then the base sample again after ``clear_lora``."""
    from peft.utils import get_peft_model_state_dict

    (base,) = generate(loop, model_engine, model_name, prompt_ids, request_id="lora-base")
    state = get_peft_model_state_dict(lora_module)
    config, tensors = adapter.rollout_lora(state, lora_module.peft_config["default"].to_dict())
    try:
        bound = loop.run(model_engine.load_lora_tensors(config, tensors))
        adapted = generate(loop, model_engine, model_name, prompt_ids, n=2, request_id="lora-on")
    finally:
        loop.run(model_engine.clear_lora())
    (restored,) = generate(loop, model_engine, model_name, prompt_ids, request_id="lora-removed")
    return {"base": base, "bound": bound, "adapted": adapted, "restored": restored}


def test_lora_sync_changes_the_image_the_actor_replays_it_and_removal_restores_the_base(
    model_name, adapter, tiny_path, lora_module, synced
):
    """The pushed LoRA binds every weight on the expected layers and changes the image; the actor (diffusers +
    peft with the same LoRA) reproduces the rollout's log-probs; once removed, the rollout samples the base again."""
    assert len(synced["bound"]) == LORA_LAYERS[model_name], synced["bound"]
    adapted, base = synced["adapted"], synced["base"]
    assert not torch.equal(adapted[0].diffusion_output, base.diffusion_output)
    replayed = replay_log_probs(adapter, tiny_path, adapted, sampling(model_name), module=lora_module)
    diff = float((replayed - torch.stack([o.rollout_log_probs for o in adapted])).abs().max())
    print(f"{model_name}: with the synced LoRA, rollout vs actor replay max |log_prob diff| = {diff:.3e}")
    assert diff <= 1e-5
    assert torch.equal(synced["restored"].diffusion_output, base.diffusion_output)
    assert torch.equal(synced["restored"].rollout_log_probs, base.rollout_log_probs)


def test_checkpoint_lora_directory_served_from_file_equals_the_synced_lora(
    loop, model_engine, model_name, prompt_ids, adapter, lora_module, synced, tmp_path
):
    """A checkpoint's ``lora/`` directory of the same LoRA, loaded by vLLM-Omni's own LoRA manager from disk (a file
    ``LoRARequest``: PEFT config and safetensors parsed by vLLM, module names checked against the model's), gives
    the in-memory sync's samples bit for bit. (Stock vLLM-Omni's own pipelines serve it in
    ``test_stock_lora_serving.py``; Z-Image's cannot load a checkpoint of other sizes than the released one.)"""
    from vllm.lora.request import LoRARequest

    from verl_omni.workers.engine.fsdp.checkpoint import ADAPTER_NAME, gather_lora_state_dict, save_lora_dir

    save_lora_dir(
        adapter, tmp_path / "lora", gather_lora_state_dict(lora_module), lora_module.peft_config[ADAPTER_NAME].to_dict()
    )
    request = LoRARequest(lora_name="ckpt", lora_int_id=10_000, lora_path=str(tmp_path / "lora"))
    served = generate(loop, model_engine, model_name, prompt_ids, n=2, request_id="lora-file", lora_request=request)
    for a, b in zip(served, synced["adapted"], strict=True):
        assert torch.equal(a.diffusion_output, b.diffusion_output)
        assert torch.equal(a.rollout_log_probs, b.rollout_log_probs)


@pytest.fixture(scope="module")
def split_engine(tiny_path, adapter, loop):
    """The model's engine split over two workers (``ulysses_degree``), for a model whose rollout can split."""
    rollout = start_engine(loop, tiny_path, "float32", (H, W), ulysses_degree=SPLIT_DEGREE)
    yield rollout
    rollout.shutdown()


@pytest.mark.parametrize("model_name", SPLIT_ROLLOUT_MODELS, indirect=True)
def test_a_split_replica_samples_what_the_unsplit_one_does_before_and_after_a_lora_push(
    loop, split_engine, model_engine, model_name, prompt_ids, adapter, lora_module
):
    """Sequence parallelism in the rollout changes no sample (``sequence_parallel_helpers``)."""
    from peft.utils import get_peft_model_state_dict

    lora = adapter.rollout_lora(get_peft_model_state_dict(lora_module), lora_module.peft_config["default"].to_dict())
    check_split_replica(
        loop,
        model_engine,
        split_engine,
        lambda engine, request_id: generate(loop, engine, model_name, prompt_ids, n=2, request_id=request_id),
        lora,
    )

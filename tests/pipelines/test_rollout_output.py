"""A rollout's output on its way to the trainer (``pipelines/rollout_output.py``), through vLLM-Omni 0.26's own hops.

Each test sends a real recorder's output through the code the engine runs between the pipeline and the client:
the worker's packing (``pack_diffusion_output_shm``, as our CPU output thread calls it, then the result queue's
pickle), the executor's unpacking, ``DiffusionEngine.postprocess_output`` with the model's own post-process (as
the engine looks it up, so with our final-pixels hook), the client's ``unpack_request_output`` and the rollout
server's ``own_storage``. The engine object is a namespace with the three attributes that method reads; the
real engines run the same path in ``tests/workers/rollout/vllm_omni/test_*rollout_engine.py``.
"""

import functools
import json
import pickle
from multiprocessing import shared_memory
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from diffusers.image_processor import VaeImageProcessor

from verl_omni.pipelines import rollout_output
from verl_omni.pipelines.diffusers_rollout import DiffusersRolloutMixin
from verl_omni.pipelines.recorder import RolloutRecorder
from verl_omni.pipelines.rollout_request import RolloutRequest
from verl_omni.pipelines.sampling import SamplingSpec
from verl_omni.pipelines.schedulers.flow_match_sde import FlowMatchSDEDiscreteScheduler, schedule_sigmas
from verl_omni.utils import vllm_omni_compat
from verl_omni.workers.rollout.vllm_omni.engine import unpack_request_output
from verl_omni.workers.rollout.vllm_omni.schemas import own_storage

# 384²: a 3-sample request's pixels and latents pass vLLM-Omni's 1 MB shared-memory threshold, a 2-sample one's not
SIZE, STEPS, CHANNELS = 384, 4, 16
SEEDS = ((0, 1, 2), (5, 6))
TEXT_LEN, TEXT_DIM = 40, 4096
# the models whose vLLM-Omni post-process turns float images into PIL images
MODEL_CLASSES = ("StableDiffusion3Pipeline", "FluxPipeline", "ZImagePipeline", "QwenImagePipeline")


def tie_values() -> torch.Tensor:
    """Decoded values whose pixel ``(x * 0.5 + 0.5) * 255`` is exactly k + 0.5 in fp32: rounding half to even
    (the post-process's numpy round) and half up give different pixels there."""
    k = torch.arange(255, dtype=torch.float32)
    values = ((k + 0.5) / 255 - 0.5) / 0.5
    pixels = (values * 0.5 + 0.5) * 255
    return values[(pixels - pixels.floor()) == 0.5]


def decoded_images(n: int) -> torch.Tensor:
    """``[n, 3, SIZE, SIZE]`` fp32 in about [-1.2, 1.2] (clamped values too), the ties in every image."""
    images = torch.randn(n, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(0)) * 0.6
    ties = tie_values()
    images.view(n, -1)[:, : ties.numel()] = ties
    return images


def test_the_images_hold_ties_of_both_parities():
    pixels = (tie_values() * 0.5 + 0.5) * 255
    assert {int(p) % 2 for p in pixels.floor()} == {0, 1} and len(pixels) > 100


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pixels_are_the_stock_post_process_pixels(dtype):
    images = decoded_images(2).to(dtype)
    # what the engine's post-process gave (fp32 images, as the worker's transfer casts bf16), read as the client did
    pil = VaeImageProcessor().postprocess(images.float(), output_type="pil")
    expected = torch.stack([torch.from_numpy(np.array(im)).permute(2, 0, 1) for im in pil])
    pixels = rollout_output.image_pixels(images)
    assert pixels.dtype == torch.uint8
    assert torch.equal(pixels, expected)


def test_a_small_tensor_is_copied_out_of_its_base_and_a_large_one_left_in_place():
    threshold = vllm_omni_compat.shm_tensor_threshold()
    large = torch.zeros(threshold // 4 + 1)
    base = torch.zeros(4, threshold // 16)
    small = rollout_output.for_transport(base[1])
    assert rollout_output.for_transport(large) is large
    assert torch.equal(small, base[1]) and small.untyped_storage().nbytes() == small.numel() * 4


def recorded(seeds_per_request=SEEDS) -> RolloutRecorder:
    """A recorder that stepped requests of ``seeds_per_request`` through STEPS steps (a stand-in velocity)."""
    requests = [
        RolloutRequest.build([1, 2], [3], SamplingSpec(num_inference_steps=STEPS, height=SIZE, width=SIZE, seeds=seeds))
        for seeds in seeds_per_request
    ]
    recorder = RolloutRecorder(requests, torch.device("cpu"))
    side = SIZE // 8
    latents = torch.cat([torch.randn(1, CHANNELS, side, side, generator=g) for g in recorder.generators])
    scheduler = FlowMatchSDEDiscreteScheduler(shift=3.0)
    scheduler.set_timesteps(STEPS)
    recorder.set_schedule(schedule_sigmas(scheduler), scheduler.timesteps)
    for _ in range(STEPS):
        latents = recorder.step(torch.tanh(latents), latents)
    return recorder


def conditioning(recorder: RolloutRecorder) -> dict[str, torch.Tensor]:
    """Per-sample conditioning as ``per_sample`` makes it: bf16 embeddings with a mask (padding the first request
    only needs for its batch companion's longer prompt), and an unmasked pooled row."""
    rows = []
    for j, rows_j in enumerate(recorder.rows()):
        rows += [j] * len(rows_j)
    embeds = torch.randn(len(SEEDS), TEXT_LEN, TEXT_DIM, generator=torch.Generator().manual_seed(1)).bfloat16()
    mask = torch.ones(len(SEEDS), TEXT_LEN, dtype=torch.bool)
    mask[0, TEXT_LEN - 7 :] = False
    pooled = torch.randn(len(SEEDS), 64, generator=torch.Generator().manual_seed(2)).bfloat16()
    return {"prompt_embeds": embeds[rows], "prompt_embeds_mask": mask[rows], "pooled_prompt_embeds": pooled[rows]}


@pytest.fixture(scope="module")
def hooked():
    assert vllm_omni_compat.patch_final_pixels_postprocess()


def engine_for(model_class: str, tmp_path):
    """What ``DiffusionEngine.postprocess_output`` reads of its engine, the model's post-process looked up as the
    engine does (a model directory with the VAE config it reads)."""
    from vllm_omni.diffusion import diffusion_engine

    (tmp_path / "vae").mkdir(exist_ok=True)
    (tmp_path / "vae" / "config.json").write_text(json.dumps({"block_out_channels": [8, 8, 8, 8]}))
    od_config = SimpleNamespace(
        model=str(tmp_path), model_class_name=model_class, output_type="pil", enable_cpu_offload=False
    )
    post_process = diffusion_engine.get_diffusion_post_process_func(od_config)
    assert post_process is not None
    return SimpleNamespace(
        od_config=od_config, post_process_func=post_process, _post_process_accepts_sampling_params=False
    )


def engine_request(n: int):
    from vllm_omni.diffusion.request import OmniDiffusionRequest
    from vllm_omni.inputs.data import OmniDiffusionSamplingParams

    params = OmniDiffusionSamplingParams(height=SIZE, width=SIZE, num_outputs_per_prompt=n)
    return OmniDiffusionRequest(prompt={"prompt_token_ids": [1, 2]}, request_id="r", sampling_params=params)


def shm_names(value) -> list[str]:
    """The shared-memory segments a packed output refers to."""
    if isinstance(value, dict) and value.get("__tensor_shm__"):
        return [value["name"]]
    if isinstance(value, dict):
        return [name for item in value.values() for name in shm_names(item)]
    return []


def through_the_engine(output, engine, n: int, segments: list | None = None):
    """``output`` from the worker to the trainer-bound samples, hop by hop."""
    from vllm_omni.diffusion.diffusion_engine import DiffusionEngine
    from vllm_omni.diffusion.ipc import pack_diffusion_output_shm, unpack_diffusion_output_shm

    pack_diffusion_output_shm(output)
    if segments is not None:
        segments += shm_names(output.output)
    received = unpack_diffusion_output_shm(pickle.loads(pickle.dumps(output, protocol=pickle.HIGHEST_PROTOCOL)))
    (final,) = DiffusionEngine.postprocess_output(engine, engine_request(n), received)
    return own_storage(unpack_request_output(final, n))


def requests_samples(engine, stock_layout: bool, monkeypatch) -> list[list]:
    """Each request's samples through the engine, from final pixels or (a version off the gap) the stock layout."""
    if stock_layout:
        off_gap = functools.partial(vllm_omni_compat.final_pixels_passthrough, "0.27.0")
        monkeypatch.setattr(rollout_output, "final_pixels_passthrough", off_gap)
    recorder = recorded()
    images = decoded_images(recorder.num_samples)
    outputs = DiffusersRolloutMixin().rollout_outputs(recorder, images, conditioning(recorder), packed=False)
    monkeypatch.undo()
    return [through_the_engine(o, engine, len(rows)) for o, rows in zip(outputs, recorder.rows(), strict=True)]


@pytest.mark.parametrize("model_class", MODEL_CLASSES)
def test_final_pixels_give_the_trainer_what_the_stock_layout_gave(model_class, hooked, tmp_path, monkeypatch):
    """Bit for bit, sample by sample: images, log-probs and every extra field, dtypes included."""
    engine = engine_for(model_class, tmp_path)
    old = requests_samples(engine, stock_layout=True, monkeypatch=monkeypatch)
    new = requests_samples(engine, stock_layout=False, monkeypatch=monkeypatch)
    assert [len(samples) for samples in new] == [len(seeds) for seeds in SEEDS]
    for old_samples, new_samples in zip(old, new, strict=True):
        for a, b in zip(old_samples, new_samples, strict=True):
            assert b.diffusion_output.dtype == torch.uint8 and b.diffusion_output.shape == (3, SIZE, SIZE)
            assert torch.equal(a.diffusion_output, b.diffusion_output)
            assert torch.equal(a.rollout_log_probs, b.rollout_log_probs)
            assert sorted(a.extra_fields) == sorted(b.extra_fields)
            for name, value in a.extra_fields.items():
                other = b.extra_fields[name]
                same = value == other if not isinstance(value, torch.Tensor) else torch.equal(value, other)
                assert same and getattr(value, "dtype", None) == getattr(other, "dtype", None), name
    # the first request's padding columns dropped, the second's prompt (its batch's longest) kept whole
    assert new[0][0].extra_fields["prompt_embeds"].shape == (TEXT_LEN - 7, TEXT_DIM)
    assert new[1][0].extra_fields["prompt_embeds"].shape == (TEXT_LEN, TEXT_DIM)


def test_a_requests_shared_memory_segments_are_freed_when_the_engine_reads_them(hooked, tmp_path):
    engine = engine_for("StableDiffusion3Pipeline", tmp_path)
    recorder = recorded(SEEDS[:1])
    outputs = DiffusersRolloutMixin().rollout_outputs(
        recorder, decoded_images(recorder.num_samples), conditioning(recorder), packed=False
    )
    segments = []
    through_the_engine(outputs[0], engine, len(SEEDS[0]), segments)
    # the pixels and the latents went through shared memory (the rest, under 1 MB, was pickled)
    assert len(segments) == 2
    for name in segments:
        with pytest.raises(FileNotFoundError):
            shared_memory.SharedMemory(name=name)


def test_a_stock_output_is_still_post_processed_with_the_hook_in_place(hooked, tmp_path):
    engine = engine_for("StableDiffusion3Pipeline", tmp_path)
    images = decoded_images(2)
    from vllm_omni.diffusion.data import DiffusionOutput
    from vllm_omni.diffusion.diffusion_engine import DiffusionEngine

    (final,) = DiffusionEngine.postprocess_output(engine, engine_request(2), DiffusionOutput(output=images))
    assert [type(im).__name__ for im in final.images] == ["Image", "Image"]


def test_the_hook_keeps_the_post_process_signature_the_engine_inspects(hooked):
    from vllm_omni.diffusion.diffusion_engine import _func_accepts_parameter

    def with_params(images, sampling_params=None):
        return images

    def without(images):
        return images

    wrapped = vllm_omni_compat._passing_final_pixels(with_params)
    assert _func_accepts_parameter(wrapped, "sampling_params")
    assert not _func_accepts_parameter(vllm_omni_compat._passing_final_pixels(without), "sampling_params")

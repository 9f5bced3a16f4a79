"""``unpack_request_output``: one engine request's output becomes N per-sample outputs (no engine, seconds).

The engine tests (``test_rollout_engine.py``, ``test_diffusers_rollout_engine.py``) run the same code on
real outputs and replay the conditioning it hands out; here its row rules are checked case by case on a
plain object with the fields of vLLM-Omni's ``OmniRequestOutput`` that it reads.
"""

from types import SimpleNamespace

import numpy as np
import PIL.Image
import pytest
import torch

from verl_omni.workers.rollout.vllm_omni.engine import unpack_request_output

N, W, L, D = 3, 2, 5, 4


def output(**overrides):
    trajectory = {
        "all_latents": torch.randn(N, W + 1, 8, 4),
        "rollout_log_probs": torch.randn(N, W),
        "all_timesteps": torch.rand(N, W),
        "window_start": torch.zeros(N, dtype=torch.long),
        # the request's conditioning, once for its samples (recorder.shared_row)
        "prompt_embeds": torch.randn(1, L, D),
        "prompt_embeds_mask": torch.ones(1, L, dtype=torch.long),
    } | overrides
    images = [PIL.Image.new("RGB", (8, 8), (i * 40, 0, 0)) for i in range(N)]
    return SimpleNamespace(multimodal_output={"trajectory": trajectory}, images=images, request_id="r0")


def test_each_sample_gets_its_recorded_rows_and_the_requests_shared_conditioning():
    request = output()
    trajectory = request.multimodal_output["trajectory"]
    samples = unpack_request_output(request, N)
    assert len(samples) == N
    for i, sample in enumerate(samples):
        assert torch.equal(sample.rollout_log_probs, trajectory["rollout_log_probs"][i])
        assert torch.equal(sample.extra_fields["all_latents"], trajectory["all_latents"][i])
        assert torch.equal(sample.extra_fields["prompt_embeds"], trajectory["prompt_embeds"][0])
        assert sample.diffusion_output[0, 0, 0].item() == i * 40


def test_per_sample_conditioning_is_still_read_row_by_row():
    per_sample = torch.randn(N, L, D)
    samples = unpack_request_output(output(prompt_embeds=per_sample), N)
    for i, sample in enumerate(samples):
        assert torch.equal(sample.extra_fields["prompt_embeds"], per_sample[i])


@pytest.mark.parametrize(
    "name, value",
    [
        ("rollout_log_probs", torch.randn(1, W)),
        ("all_latents", torch.randn(1, W + 1, 8, 4)),
        ("prompt_embeds", torch.randn(2, L, D)),
    ],
)
def test_a_row_count_that_is_neither_n_nor_a_shared_row_is_refused(name, value):
    # a recorded tensor is per sample: one row for N samples is a pipeline bug, never broadcast
    with pytest.raises(RuntimeError, match=f"trajectory {name} has {value.shape[0]} rows for {N} samples"):
        unpack_request_output(output(**{name: value}), N)


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L"])
def test_each_image_becomes_contiguous_uint8_channels_first_as_pil_reads_it(mode):
    pixels = torch.randint(0, 256, (N, 6, 5, 4), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    request = output()
    request.images = [PIL.Image.fromarray(p.numpy(), "RGBA").convert(mode) for p in pixels]
    for image, sample in zip(request.images, unpack_request_output(request, N), strict=True):
        # what PIL's RGB conversion gives, height x width x channel, read channel-first
        expected = torch.from_numpy(np.asarray(image.convert("RGB"))).permute(2, 0, 1)
        assert sample.diffusion_output.dtype == torch.uint8 and sample.diffusion_output.is_contiguous()
        assert torch.equal(sample.diffusion_output, expected)


def final_pixels_output(**overrides):
    """An output as the final-pixels path delivers it: one uint8 ``[N, 3, H, W]`` tensor as the images."""
    request = output(**overrides)
    request.images = [
        torch.randint(0, 256, (N, 3, 6, 5), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    ]
    return request


def test_final_pixels_are_split_into_each_samples_image():
    request = final_pixels_output()
    for i, sample in enumerate(unpack_request_output(request, N)):
        assert sample.diffusion_output.shape == (3, 6, 5) and torch.equal(sample.diffusion_output, request.images[0][i])


@pytest.mark.parametrize(
    "pixels, message",
    [
        (torch.zeros(N, 3, 6, 5), "engine returned torch.float32 images: the rollout's final pixels are uint8"),
        (torch.zeros(N - 1, 3, 6, 5, dtype=torch.uint8), f"engine returned {N - 1} images for {N} samples"),
    ],
)
def test_final_pixels_of_another_dtype_or_count_are_refused(pixels, message):
    request = final_pixels_output()
    request.images = [pixels]
    with pytest.raises(RuntimeError, match=message):
        unpack_request_output(request, N)


@pytest.mark.parametrize("name", ["all_latents", "rollout_log_probs", "all_timesteps"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_recorded_value_is_refused(name, bad):
    request = final_pixels_output()
    request.multimodal_output["trajectory"][name].view(-1)[-1] = bad
    with pytest.raises(FloatingPointError, match=f"trajectory {name} of request r0 has non-finite values"):
        unpack_request_output(request, N)


def test_own_storage_sends_each_sample_alone_and_the_shared_row_once():
    """Pickled together (Ray's return of ``generate_batched``), the samples carry their own rows only: the
    request's latents and pixels once in all, its conditioning row once, where views would carry them N times."""
    import pickle

    from verl_omni.workers.rollout.vllm_omni.schemas import own_storage

    request = final_pixels_output(all_latents=torch.randn(N, W + 1, 64, 64), prompt_embeds=torch.randn(1, 64, 64))
    trajectory = request.multimodal_output["trajectory"]
    views = unpack_request_output(request, N)
    view_bytes = len(pickle.dumps(views))
    samples = own_storage(unpack_request_output(request, N))
    latent_bytes, embed_bytes = trajectory["all_latents"].nbytes, trajectory["prompt_embeds"].nbytes
    assert view_bytes > N * latent_bytes
    assert latent_bytes + embed_bytes < len(pickle.dumps(samples)) < 1.1 * (latent_bytes + embed_bytes)
    assert samples[0].extra_fields["prompt_embeds"] is samples[-1].extra_fields["prompt_embeds"]
    for i, (sample, view) in enumerate(zip(samples, views, strict=True)):
        assert torch.equal(sample.diffusion_output, view.diffusion_output)
        assert torch.equal(sample.extra_fields["all_latents"], trajectory["all_latents"][i])
        assert sample.extra_fields["all_latents"].untyped_storage().nbytes() == latent_bytes // N


def test_a_video_requests_frame_array_becomes_uint8_frames_per_sample():
    """vLLM-Omni's video post-process (Wan2.2) gives one ``[N, F, H, W, 3]`` array in [0, 1] for the request; each
    sample gets its uint8 ``[F, 3, H, W]`` video, rounded as diffusers rounds pixels, beside its 5-D latents."""
    frames = np.random.default_rng(0).random((N, 5, 8, 16, 3)).astype(np.float32)
    request = output(all_latents=torch.randn(N, W + 1, 4, 2, 1, 2))
    request.images = [frames]
    samples = unpack_request_output(request, N)
    for i, sample in enumerate(samples):
        assert sample.diffusion_output.dtype == torch.uint8 and sample.diffusion_output.shape == (5, 3, 8, 16)
        expected = torch.from_numpy(np.round(frames[i] * 255).astype(np.uint8)).permute(0, 3, 1, 2)
        assert torch.equal(sample.diffusion_output, expected)
        assert sample.extra_fields["all_latents"].shape == (W + 1, 4, 2, 1, 2)
    with pytest.raises(RuntimeError, match=f"engine returned {N} images for {N + 1} samples"):
        unpack_request_output(request, N + 1)


def test_final_pixels_of_a_video_request_become_each_samples_frames():
    """A video pipeline's final pixels are its decoded layout ``[N, 3, F, H, W]`` in uint8; each sample gets
    ``[F, 3, H, W]``, the layout the frame-array path gives."""
    request = output(all_latents=torch.randn(N, W + 1, 4, 2, 1, 2))
    pixels = torch.randint(0, 256, (N, 3, 5, 8, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    request.images = [pixels]
    for i, sample in enumerate(unpack_request_output(request, N)):
        assert sample.diffusion_output.shape == (5, 3, 8, 16)
        assert torch.equal(sample.diffusion_output, pixels[i].permute(1, 0, 2, 3))

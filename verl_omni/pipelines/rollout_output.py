"""How a rollout pipeline's per-request output leaves the diffusion worker: final pixels and a trajectory.

vLLM-Omni 0.26 carries a pipeline's ``DiffusionOutput`` from the worker process to the client in three hops:
the worker's output thread copies the tensors of ``output.output`` above a size threshold to the host on a
side stream and through POSIX shared memory (everything else is pickled), the engine runs the model's
post-process (SD3, FLUX, Z-Image, Qwen-Image: ``VaeImageProcessor.postprocess``, float pixels to PIL
images), and the client reads the result. A rollout needs neither PIL images nor host copies made inside
its forward, so each request's output here is, batched over its N samples::

    DiffusionOutput(output={"payload": {"image": uint8 [N, 3, H, W], "trajectory": {name: tensor}}})

and, for a model that also generates sound (LTX-2), ``"audio"``: float32 waveforms ``[N, channels, samples]`` in
[-1, 1] in the payload and their rate in the envelope's ``"metadata"`` (``{"audio": {"sample_rate": hz}}``), the
names vLLM-Omni's output formatter carries to the request output's ``multimodal_output`` (``"audio"``,
``"audio_sample_rate"``).

* ``image``: the pixels the post-process would have made (:func:`image_pixels`, computed on the device),
  a quarter of the float images' bytes; an envelope whose image is uint8 is final, and the engine passes
  it through (``is_final_pixels_output``, the hook of gap ``final_pixels_postprocess`` in
  :mod:`verl_omni.utils.vllm_omni_compat`, which owns the envelope's two keys).
* ``trajectory``: the recorder's tensors and the request's conditioning; the large ones stay on the device
  for the worker's side-stream copy, the small ones are copied now (:func:`for_transport`).

On a vLLM-Omni version the gap was not seen open in, the output is the one every stock post-process takes:
the float images as the output tensor and the trajectory, on the host, in ``trajectory_latents`` (slower:
the trajectory is pickled and the images go through PIL). ``engine.unpack_request_output`` reads both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from verl_omni.utils.vllm_omni_compat import (
    ENVELOPE_KEY,
    IMAGE_KEY,
    final_pixels_passthrough,
    shm_tensor_threshold,
)

if TYPE_CHECKING:
    from vllm_omni.diffusion.data import DiffusionOutput

TRAJECTORY_KEY = "trajectory"
# a model with sound: the name of its waveforms and of their rate (Hz), the same from the pipeline's payload (vLLM-Omni
# carries them to the request output's ``multimodal_output``) to the rollout batch (the reward's default
# ``reward.diffusion.audio_key``, whose rate key is ``<audio_key>_sample_rate``)
AUDIO_KEY = "audio"
AUDIO_RATE_KEY = f"{AUDIO_KEY}_sample_rate"


def image_pixels(images: torch.Tensor) -> torch.Tensor:
    """``[B, 3, H, W]`` decoded images in [-1, 1] (any float dtype) → uint8 pixels, on their device.

    The same values as the models' vLLM-Omni post-process (diffusers ``VaeImageProcessor.postprocess`` to PIL,
    read back channel-first): ``(x * 0.5 + 0.5).clamp(0, 1)`` in fp32, ``* 255``, rounded half to even, as
    its torch and numpy steps do; each is one correctly rounded fp32 operation, so CPU and GPU agree.
    """
    pixels = images.to(torch.float32, copy=True)
    pixels.mul_(0.5).add_(0.5).clamp_(0, 1).mul_(255).round_()
    return pixels.to(torch.uint8)


def all_finite(tensor: torch.Tensor) -> bool:
    """Whether every value of ``tensor`` is finite, from its min and max (NaN and ±inf reach them): one
    reduction read back, where ``isfinite(...).all()`` first writes a bool per value (on the host, 5-10×
    slower for a request's latents or images)."""
    if tensor.numel() == 0:
        return True
    low, high = torch.aminmax(tensor)
    return bool(torch.isfinite(low) & torch.isfinite(high))


def for_transport(tensor: torch.Tensor) -> torch.Tensor:
    """Where ``tensor`` should be when the forward returns.

    Above vLLM-Omni's shared-memory threshold it stays where it is: the worker's output thread copies it to
    pinned host memory on a side stream, after the forward and off its critical path. Below, it is pickled,
    so it goes to the host now (a device tensor would be rebuilt on the device in the engine's process),
    and a view is copied out of its base (pickle writes a view's whole storage).
    """
    if tensor.numel() * tensor.element_size() > shm_tensor_threshold():
        return tensor
    tensor = tensor.detach().cpu()
    if tensor.untyped_storage().nbytes() > tensor.numel() * tensor.element_size():
        tensor = tensor.clone()
    return tensor


def request_output(
    images: torch.Tensor,
    trajectory: dict[str, torch.Tensor],
    audio: torch.Tensor | None = None,
    audio_sample_rate: int | None = None,
) -> DiffusionOutput:
    """One request's output: its decoded ``images`` ``[N, 3, H, W]`` in [-1, 1] (a video model's ``[N, 3, F, H, W]``),
    its ``trajectory`` (recorded tensors and conditioning, on the device or the host) and, for a model with sound,
    its ``audio`` waveforms ``[N, channels, samples]`` at ``audio_sample_rate`` Hz, in the layout described above."""
    # imported here: the client (``engine.unpack_request_output``) uses this module without vLLM-Omni loaded
    from vllm_omni.diffusion.data import DiffusionOutput

    if audio is not None and audio_sample_rate is None:
        raise ValueError("request_output: audio needs its audio_sample_rate")
    if not final_pixels_passthrough():
        if audio is not None:
            raise NotImplementedError(
                "audio leaves the rollout in the final-pixels envelope only: this vLLM-Omni version does not pass it "
                "through (gap final_pixels_postprocess, verl_omni.utils.vllm_omni_compat)"
            )
        host = {name: value.detach().cpu() for name, value in trajectory.items()}
        return DiffusionOutput(output=images.float(), trajectory_latents=host)
    payload = {
        IMAGE_KEY: for_transport(image_pixels(images)),
        TRAJECTORY_KEY: {name: for_transport(value) for name, value in trajectory.items()},
    }
    envelope: dict = {ENVELOPE_KEY: payload}
    if audio is not None:
        payload[AUDIO_KEY] = for_transport(audio.detach().float())
        envelope["metadata"] = {"audio": {"sample_rate": int(audio_sample_rate)}}
    return DiffusionOutput(output=envelope)

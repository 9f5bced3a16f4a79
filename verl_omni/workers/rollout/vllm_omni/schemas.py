"""What a diffusion rollout returns per sample (docs/design.md, "Data contracts")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class DiffusionOutput:
    """One generated sample.

    Args:
        diffusion_output (`torch.Tensor`, uint8): the image ``[3, H, W]`` or the video ``[F, 3, H, W]``.
        rollout_log_probs (`torch.Tensor`, ``[W]``): log-probs of the W recorded SDE transitions (the
            trainer's batch key of the same name).
        extra_fields (`dict`): ``all_latents`` [W+1, ...] (packed tokens ``[S, C]`` per step for images, the
            video latent ``[C, F', h, w]`` for video), ``all_timesteps`` [W], ``window_start``,
            ``prompt_embeds`` [L, D], ``prompt_embeds_mask`` [L] and, with CFG,
            ``negative_prompt_embeds`` / ``negative_prompt_embeds_mask``.
        audio (`torch.Tensor` or None): a model with sound (LTX-2): the sample's waveform ``[channels, samples]``,
            float32 in [-1, 1]; None for a silent model.
        audio_sample_rate (`int` or None): the waveform's samples per second.
        stop_reason (`str`): ``"completed"`` or ``"aborted"``.
        num_preempted (`int` or None): kept for parity with verl's ``TokenOutput`` metrics.
    """

    diffusion_output: torch.Tensor
    rollout_log_probs: torch.Tensor
    extra_fields: dict[str, Any] = field(default_factory=dict)
    audio: torch.Tensor | None = None
    audio_sample_rate: int | None = None
    stop_reason: str = "completed"
    num_preempted: int | None = None


def own_storage(outputs: list[DiffusionOutput]) -> list[DiffusionOutput]:
    """``outputs`` with every tensor that is a view of a larger one copied out of it, for a pickle (Ray's
    return of ``generate_batched``).

    ``engine.unpack_request_output`` hands each sample views of the request's batched tensors, and pickle
    writes a view's whole storage: N samples of a request would carry N times its trajectory and images. A
    tensor shared by the samples (the request's conditioning row) stays one object: copied once, pickled once.
    """
    # id -> (view, copy): the views are kept alive while ids are compared
    copies: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def own(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        if value.untyped_storage().nbytes() <= value.numel() * value.element_size():
            return value
        if id(value) not in copies:
            copies[id(value)] = (value, value.clone())
        return copies[id(value)][1]

    for output in outputs:
        output.diffusion_output = own(output.diffusion_output)
        output.rollout_log_probs = own(output.rollout_log_probs)
        output.audio = own(output.audio)
        output.extra_fields = {name: own(value) for name, value in output.extra_fields.items()}
    return outputs

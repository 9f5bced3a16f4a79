"""FLUX.2-klein on the training side: the FLUX.2 velocity of :mod:`verl_omni.pipelines.flux2.training_adapter`.

The transformer, schedule, recorded latents and velocity are FLUX.2-dev's (:class:`Flux2FamilyAdapter`); klein
differs in its text encoder (Qwen3, layers 9, 18 and 27 stacked, the chat-templated prompt padded to 512 tokens)
and its guidance: no guidance embedding; the base model uses classic CFG against the empty prompt,
``neg + w·(pos − neg)`` with w the pipelines' ``guidance_scale``.

Two kinds of checkpoint share the architecture name; ``model_index.json``'s ``is_distilled`` tells them
apart (:meth:`Flux2KleinTrainingAdapter.for_checkpoint`): the base model (CFG, 50 steps) and the
step-distilled one (4 steps, no CFG: the pipelines ignore its guidance scale), whose adapter refuses
``true_cfg_scale`` > 1 before Ray starts.

What the rollout must record per sample (besides ``all_latents`` ``[W+1, S, 4C]`` and ``all_timesteps``
``[W]``): ``prompt_embeds`` ``[T, 3D]``; with CFG also ``negative_prompt_embeds`` (the empty prompt's).
"""

from __future__ import annotations

import json
from pathlib import Path

from verl_omni.pipelines.flux2.training_adapter import Flux2FamilyAdapter
from verl_omni.pipelines.model_base import register_model_adapter

# Flux2KleinPipeline's default guidance_scale, the base model's recommended CFG scale
BASE_CFG_SCALE = 4.0


def is_distilled(model_path: str | Path) -> bool:
    """Whether the checkpoint is the step-distilled klein (``model_index.json``'s ``is_distilled``)."""
    index = Path(model_path) / "model_index.json"
    return bool(json.loads(index.read_text()).get("is_distilled", False)) if index.is_file() else False


@register_model_adapter("Flux2KleinPipeline")
class Flux2KleinTrainingAdapter(Flux2FamilyAdapter):
    """Training adapter for ``Flux2KleinPipeline`` checkpoints: the base model (CFG); see the distilled variant."""

    rollout_pipeline = "verl_omni.pipelines.flux2_klein.rollout_pipeline.Flux2KleinLogProbPipeline"
    guidance_style = "cfg"
    default_true_cfg_scale = BASE_CFG_SCALE
    lora_file_pipeline = "Flux2KleinPipeline"
    cfg_conditioning_keys = ("negative_prompt_embeds",)

    @classmethod
    def for_checkpoint(cls, model_path: str | Path) -> type[Flux2KleinTrainingAdapter]:
        """The step-distilled variant for a checkpoint with ``is_distilled: true``, this one otherwise."""
        return Flux2KleinDistilledTrainingAdapter if is_distilled(model_path) else cls


class Flux2KleinDistilledTrainingAdapter(Flux2KleinTrainingAdapter):
    """The step-distilled FLUX.2-klein (``is_distilled: true``): one pass per step, no CFG. Found through
    :meth:`Flux2KleinTrainingAdapter.for_checkpoint`, not registered under a name of its own."""

    default_true_cfg_scale = 1.0
    # the pipelines ignore the guidance scale of a distilled klein: CFG is refused before Ray starts
    sampler_choices = {"true_cfg_scale": (1.0,)}
    cfg_refusal = (
        "the step-distilled FLUX.2-klein samples without CFG; set actor_rollout_ref.rollout.true_cfg_scale=1 (or use "
        "the base klein checkpoint for CFG)"
    )

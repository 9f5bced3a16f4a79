"""vLLM-Omni FLUX.2-klein pipeline that samples with the Flow-GRPO SDE step and records log-probs.

Named by ``Flux2KleinTrainingAdapter.rollout_pipeline``; vLLM-Omni loads it as the custom pipeline of a
``Flux2KleinPipeline`` checkpoint. The loop is FLUX.2-dev's (:class:`~verl_omni.pipelines.flux2.rollout_pipeline.
Flux2RolloutMixin`: vLLM-Omni's latents, schedule, transformer and decoding, the training adapter's velocity); the
text encoding is vLLM-Omni's klein one (the chat-templated prompt padded to 512 tokens, the Qwen3 hidden states of
the configured layers stacked), and the guidance is classic CFG for the base model, none for the step-distilled
one.

The stock pipeline never reads ``model_index.json``'s ``is_distilled`` (its ``is_distilled`` is a constructor
argument vLLM-Omni's loader does not pass): this one sets it from the checkpoint, and refuses CFG for the
step-distilled model as its adapter does before Ray starts.

The prompt ids are the bare Qwen3 ids (``Flux2KleinTrainingAdapter.prompt_token_ids``); their text is what the
stock encoder templates. Recorded per sample: ``prompt_embeds`` ``[512, 3D]`` and, with CFG,
``negative_prompt_embeds`` (the empty prompt unless one is sent); the latents are FLUX.2's own ``[S, 4C]`` tokens.
"""

from __future__ import annotations

from vllm_omni.diffusion.models.flux2_klein.pipeline_flux2_klein import Flux2KleinPipeline

from verl_omni.pipelines.flux2.rollout_pipeline import Flux2RolloutMixin
from verl_omni.pipelines.flux2_klein.training_adapter import Flux2KleinTrainingAdapter, is_distilled


class Flux2KleinLogProbPipeline(Flux2RolloutMixin, Flux2KleinPipeline):
    """FLUX.2-klein rollout pipeline: token ids in; images, SDE trajectories and log-probs out."""

    adapter = Flux2KleinTrainingAdapter

    def __init__(self, *, od_config, prefix: str = ""):
        super().__init__(od_config=od_config, prefix=prefix, is_distilled=is_distilled(od_config.model))

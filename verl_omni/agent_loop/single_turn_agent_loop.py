"""``DiffusionSingleTurnAgentLoop``: one prompt, one server call (registered as ``diffusion_single_turn``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, register
from verl.utils.profiler import simple_timer

from verl_omni.agent_loop.agent_loop import DiffusionAgentLoopBase, DiffusionAgentLoopOutput
from verl_omni.utils.dataset.edit_prompts import load_row_images
from verl_omni.utils.dataset.prompt_dataset import prompt_text, row_image_key
from verl_omni.workers.rollout.vllm_omni.schemas import DiffusionOutput

logger = logging.getLogger(__name__)

AGENT_NAME = "diffusion_single_turn"
# user prompt + generated image
SINGLE_TURN_NUM_TURNS = 2


@dataclass(frozen=True)
class PromptRequest:
    """What one server call needs from a row: templated ids, negative ids (true CFG), routing key, and the
    source images of an editing model (PIL, decoded here; None for text-to-image)."""

    prompt_ids: list[int]
    negative_prompt_ids: list[int] | None
    routing_key: str | None
    images: list | None = None


@register(AGENT_NAME)
class DiffusionSingleTurnAgentLoop(DiffusionAgentLoopBase):
    """Text-to-image in a single turn: the row's prompt through the model adapter's prompt template, then one request.

    The prompt is ``raw_prompt`` (a string, or chat messages whose last user turn is the prompt);
    with the spec's ``true_cfg_scale > 1`` the negative prompt is the row's ``negative_prompt`` or the
    config's. Requests are routed on the row's ``server_routing.routing_key_field`` (``uid``). An editing
    model's (``adapter.max_source_images``) request carries the row's source images (``data.image_key``).
    """

    supports_batched = True

    def prompt_request(self, kwargs: dict[str, Any], sampling_params: dict[str, Any]) -> PromptRequest:
        """``sampling_params`` is the request's resolved :class:`SamplingSpec` dict: CFG sends the negative prompt."""
        cfg = self.rollout_config
        prompt_ids = self.adapter.prompt_token_ids(self.tokenizer, prompt_text(kwargs["raw_prompt"], "raw_prompt"))
        negative_ids = None
        if sampling_params["true_cfg_scale"] > 1:
            negative = kwargs.get("negative_prompt")
            negative = cfg.negative_prompt if negative is None else negative
            negative_ids = self.adapter.prompt_token_ids(self.tokenizer, negative)
        key = kwargs.get(cfg.server_routing.routing_key_field)
        images = None
        if self.adapter.max_source_images:
            image_key = row_image_key(self.config)
            images = load_row_images(kwargs.get(image_key), f"prompt row {kwargs.get('index')} ({image_key})")
        return PromptRequest(prompt_ids, negative_ids, None if key is None else str(key), images)

    def _output(self, request: PromptRequest, sample: DiffusionOutput, metrics: dict) -> DiffusionAgentLoopOutput:
        num_preempted = sample.num_preempted if sample.num_preempted is not None else -1
        return DiffusionAgentLoopOutput(
            prompt_ids=request.prompt_ids,
            output=sample,
            num_turns=SINGLE_TURN_NUM_TURNS,
            metrics=AgentLoopMetrics(**metrics, num_preempted=num_preempted),
        )

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> DiffusionAgentLoopOutput:
        request = self.prompt_request(kwargs, sampling_params)
        metrics: dict[str, float] = {}
        with simple_timer("generate_sequences", metrics):
            sample = await self.server_manager.generate(
                request_id=uuid4().hex,
                prompt_ids=request.prompt_ids,
                sampling_params=sampling_params,
                negative_prompt_ids=request.negative_prompt_ids,
                routing_key=request.routing_key,
                image_data=request.images,
            )
        return self._output(request, sample, metrics)

    async def run_batched(
        self, sampling_params: dict[str, Any], num_outputs: int, **kwargs
    ) -> list[DiffusionAgentLoopOutput]:
        request = self.prompt_request(kwargs, sampling_params)
        metrics: dict[str, float] = {}
        with simple_timer("generate_sequences", metrics):
            samples = await self.server_manager.generate_batched(
                request_id=uuid4().hex,
                prompt_ids=request.prompt_ids,
                sampling_params=sampling_params,
                num_outputs_per_prompt=num_outputs,
                negative_prompt_ids=request.negative_prompt_ids,
                routing_key=request.routing_key,
                image_data=request.images,
            )
        return [self._output(request, sample, dict(metrics)) for sample in samples]

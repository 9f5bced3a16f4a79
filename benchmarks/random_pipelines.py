"""The engines' pipelines on random full-size weights: ours (the rollout's log-prob pipelines) and vLLM-Omni's stock
ones, each filling its transformers in place on the device instead of reading a weight file
(``random_weights.py`` writes the directories they start from: the transformers' configs only).

The engine imports these classes by name in its worker processes: the benchmark puts this directory on
``PYTHONPATH`` before it starts an engine.
"""

from __future__ import annotations

from random_weights import fill_random_
from vllm_omni.diffusion.models.flux2.pipeline_flux2 import Flux2Pipeline
from vllm_omni.diffusion.models.flux2_klein.pipeline_flux2_klein import Flux2KleinPipeline
from vllm_omni.diffusion.models.hunyuan_video.pipeline_hunyuan_video_1_5 import HunyuanVideo15Pipeline
from vllm_omni.diffusion.models.ltx2.pipeline_ltx2 import LTX2Pipeline
from vllm_omni.diffusion.models.qwen_image.pipeline_qwen_image import QwenImagePipeline
from vllm_omni.diffusion.models.qwen_image.pipeline_qwen_image_edit import QwenImageEditPipeline
from vllm_omni.diffusion.models.sd3.pipeline_sd3 import StableDiffusion3Pipeline
from vllm_omni.diffusion.models.wan2_2.pipeline_wan2_2 import Wan22Pipeline
from vllm_omni.diffusion.models.wan2_2.pipeline_wan2_2_i2v import Wan22I2VPipeline

from verl_omni.pipelines.flux2.rollout_pipeline import Flux2LogProbPipeline
from verl_omni.pipelines.flux2_klein.rollout_pipeline import Flux2KleinLogProbPipeline
from verl_omni.pipelines.hunyuan_video_1_5.rollout_pipeline import HunyuanVideo15LogProbPipeline
from verl_omni.pipelines.ltx2.rollout_pipeline import LTX2LogProbPipeline
from verl_omni.pipelines.qwen_image.rollout_pipeline import QwenImageLogProbPipeline
from verl_omni.pipelines.qwen_image_edit.rollout_pipeline import QwenImageEditLogProbPipeline
from verl_omni.pipelines.sd3.rollout_pipeline import SD3LogProbPipeline
from verl_omni.pipelines.wan2_2.rollout_pipeline import Wan22LogProbPipeline
from verl_omni.pipelines.wan2_2_i2v.rollout_pipeline import Wan22I2VLogProbPipeline

LOG_PROB_PIPELINE = "random_pipelines.RandomLogProbQwenImagePipeline"
STOCK_PIPELINE = "random_pipelines.RandomStockQwenImagePipeline"
SD3_LOG_PROB_PIPELINE = "random_pipelines.RandomLogProbSD3Pipeline"
SD3_STOCK_PIPELINE = "random_pipelines.RandomStockSD3Pipeline"
WAN_LOG_PROB_PIPELINE = "random_pipelines.RandomLogProbWan22Pipeline"
WAN_STOCK_PIPELINE = "random_pipelines.RandomStockWan22Pipeline"
WAN_I2V_LOG_PROB_PIPELINE = "random_pipelines.RandomLogProbWan22I2VPipeline"
WAN_I2V_STOCK_PIPELINE = "random_pipelines.RandomStockWan22I2VPipeline"
EDIT_LOG_PROB_PIPELINE = "random_pipelines.RandomLogProbQwenImageEditPipeline"
EDIT_STOCK_PIPELINE = "random_pipelines.RandomStockQwenImageEditPipeline"
FLUX2_KLEIN_LOG_PROB_PIPELINE = "random_pipelines.RandomLogProbFlux2KleinPipeline"
FLUX2_KLEIN_STOCK_PIPELINE = "random_pipelines.RandomStockFlux2KleinPipeline"
FLUX2_LOG_PROB_PIPELINE = "random_pipelines.RandomLogProbFlux2Pipeline"
FLUX2_STOCK_PIPELINE = "random_pipelines.RandomStockFlux2Pipeline"
HYV15_LOG_PROB_PIPELINE = "random_pipelines.RandomLogProbHunyuanVideo15Pipeline"
HYV15_STOCK_PIPELINE = "random_pipelines.RandomStockHunyuanVideo15Pipeline"
LTX2_LOG_PROB_PIPELINE = "random_pipelines.RandomLogProbLTX2Pipeline"
LTX2_STOCK_PIPELINE = "random_pipelines.RandomStockLTX2Pipeline"


class RandomWeightsMixin:
    """``load_weights`` that fills the transformer in place and reports every parameter loaded, at the engine's
    start; later calls (a full-weight sync, ``weight_sync.py``) load the weights they are given. Components the
    engine streams through ``load_weights`` besides the transformers (FLUX.2-dev's Mistral encoder, HunyuanVideo-1.5's
    ByT5 glyph encoder: the tiny ones on disk) still load from their files, else they would keep uninitialized
    memory; the transformers' sources are dropped, their folders hold a config and no weight file."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        sources = getattr(self, "weights_sources", [])
        others = [s for s in sources if not (s.subfolder or "").startswith("transformer")]
        self._streams_others = bool(others)
        if others:
            self.weights_sources = others

    def load_weights(self, weights) -> set[str]:
        if getattr(self, "_random_filled", False):
            return super().load_weights(weights)
        self._random_filled = True
        if self._streams_others:
            super().load_weights(weights)
        # the model's own loader, given no weights, still sets what it exposes on the way (Qwen-Image's
        # ``stacked_params_mapping``, from which vLLM-Omni's LoRA manager learns the fused q/k/v layers)
        own_loader = getattr(self.transformer, "load_weights", None)
        if own_loader is not None:
            own_loader(iter(()))
        fill_random_(self.transformer)
        # the A14B's second expert (None in the single-transformer pipelines)
        if getattr(self, "transformer_2", None) is not None:
            fill_random_(self.transformer_2, seed=1)
        return {name for name, _ in self.named_parameters()}


class RandomLogProbQwenImagePipeline(RandomWeightsMixin, QwenImageLogProbPipeline):
    """The rollout's log-prob pipeline on random full-size weights."""


class RandomStockQwenImagePipeline(RandomWeightsMixin, QwenImagePipeline):
    """vLLM-Omni's own Qwen-Image pipeline on the same random weights."""


class RandomLogProbSD3Pipeline(RandomWeightsMixin, SD3LogProbPipeline):
    """The SD3 rollout's log-prob pipeline on random full-size weights."""


class RandomStockSD3Pipeline(RandomWeightsMixin, StableDiffusion3Pipeline):
    """vLLM-Omni's own SD3 pipeline on the same random weights."""


class RandomLogProbWan22Pipeline(RandomWeightsMixin, Wan22LogProbPipeline):
    """The Wan2.2 rollout's log-prob pipeline on random full-size weights."""


class RandomStockWan22Pipeline(RandomWeightsMixin, Wan22Pipeline):
    """vLLM-Omni's own Wan2.2 pipeline on the same random weights."""


class RandomLogProbWan22I2VPipeline(RandomWeightsMixin, Wan22I2VLogProbPipeline):
    """The Wan2.2 I2V rollout's log-prob pipeline on random full-size weights (both A14B experts)."""


class RandomStockWan22I2VPipeline(RandomWeightsMixin, Wan22I2VPipeline):
    """vLLM-Omni's own Wan2.2 I2V pipeline on the same random weights."""


class RandomLogProbFlux2KleinPipeline(RandomWeightsMixin, Flux2KleinLogProbPipeline):
    """The FLUX.2-klein rollout's log-prob pipeline on random full-size weights."""


class RandomStockFlux2KleinPipeline(RandomWeightsMixin, Flux2KleinPipeline):
    """vLLM-Omni's own FLUX.2-klein pipeline on the same random weights."""


class RandomLogProbFlux2Pipeline(RandomWeightsMixin, Flux2LogProbPipeline):
    """The FLUX.2-dev rollout's log-prob pipeline on random full-size weights."""


class RandomStockFlux2Pipeline(RandomWeightsMixin, Flux2Pipeline):
    """vLLM-Omni's own FLUX.2-dev pipeline on the same random weights."""


class RandomLogProbHunyuanVideo15Pipeline(RandomWeightsMixin, HunyuanVideo15LogProbPipeline):
    """The HunyuanVideo-1.5 rollout's log-prob pipeline on random full-size weights."""


class RandomStockHunyuanVideo15Pipeline(RandomWeightsMixin, HunyuanVideo15Pipeline):
    """vLLM-Omni's own HunyuanVideo-1.5 pipeline on the same random weights."""


class RandomLogProbLTX2Pipeline(RandomWeightsMixin, LTX2LogProbPipeline):
    """The LTX-2 rollout's log-prob pipeline on random full-size weights."""


class RandomStockLTX2Pipeline(RandomWeightsMixin, LTX2Pipeline):
    """vLLM-Omni's own LTX-2 pipeline on the same random weights."""


class RandomLogProbQwenImageEditPipeline(RandomWeightsMixin, QwenImageEditLogProbPipeline):
    """The Qwen-Image-Edit rollout's log-prob pipeline on random full-size weights."""


class RandomStockQwenImageEditPipeline(RandomWeightsMixin, QwenImageEditPipeline):
    """vLLM-Omni's own Qwen-Image-Edit pipeline on the same random weights."""

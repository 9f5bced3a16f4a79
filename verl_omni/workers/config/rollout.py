"""Config of the diffusion rollout (the ``actor_rollout_ref.rollout`` node with ``name: vllm_omni``).

``DiffusionRolloutConfig`` extends verl's ``RolloutConfig`` with the diffusion sampling keys, so
verl's replicas, servers and agent-loop manager (which read the text-model keys: ``nnodes``,
``n_gpus_per_node``, ``agent``, ``free_cache_engine``...) keep working on it. Every error names the
full dotted key.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import DictConfig, OmegaConf
from verl.workers.config import RolloutConfig
from verl.workers.config.rollout import AgentLoopConfig

from verl_omni.pipelines.schedulers.flow_match_sde import MAX_NOISE_LEVEL, SDE_TYPES
from verl_omni.workers.rollout.routing import RolloutServerRoutingConfig

KEY = "actor_rollout_ref.rollout"
# the agent loop a row without ``agent_name`` runs (registered in verl_omni.agent_loop)
DEFAULT_AGENT_LOOP = "diffusion_single_turn"
# Qwen-Image latents are packed 2x2 after an 8x VAE: image sides must divide by 16
IMAGE_SIDE_MULTIPLE = 16
# Generous for a busy 2-core CPU machine; vLLM-Omni's own bounds are 600 s (orchestrator) / 300 s (stage).
DEFAULT_ENGINE_START_TIMEOUT_S = 1200.0
ENGINE_START_TIMEOUT_KEY = f"{KEY}.engine_start_timeout_s"


def _diffusion_agent_config() -> AgentLoopConfig:
    return AgentLoopConfig(num_workers=2, default_agent_loop=DEFAULT_AGENT_LOOP)


@dataclass
class DiffusionRolloutConfig(RolloutConfig):
    """verl's rollout config plus diffusion sampling (Flow-GRPO SDE window, true CFG, routing).

    Args:
        height (int): image height in pixels, a multiple of 16. Default 512.
        width (int): image width in pixels, a multiple of 16. Default 512.
        num_inference_steps (int): denoising steps T. Default 10.
        true_cfg_scale (float): true-CFG scale; > 1 sends ``negative_prompt`` and records its
            embeddings, <= 1 disables CFG. Default 4.0.
        negative_prompt (str): the negative prompt when a row has none (``non_tensor_batch["negative_prompt"]``).
        noise_level (float): SDE noise level a inside the window (training), in (0, sqrt(2)] for ``sde``
            and (0, 1] for ``cps`` (``flow_match_sde.MAX_NOISE_LEVEL`` says why). Default 0.7.
        val_noise_level (float): noise level in validation, in the same range; 0 samples the deterministic
            ODE. Default 0.0.
        sde_type (str): ``"sde"`` or ``"cps"``. Default ``"sde"``.
        sde_window_size (int): W, stochastic (recorded, trained) steps per sample, 1 <= W <= T. Default 2.
        sde_window_range (list[int] | None): ``[r0, r1]``, the steps the window may cover; None is ``[0, T]``.
        model_kwargs (dict): model-specific sampling settings, sent with every request and replayed by the
            actor (``ReplaySpec.model_kwargs``); the keys the model adapter's ``sampling_keys`` names (BAGEL:
            ``timestep_shift``, ``cfg_img_scale``, ``cfg_interval``, ``cfg_renorm_type``, ``cfg_renorm_min``).
            Default empty: the model's defaults.
        enable_batched_diffusion (bool): generate each group of ``n`` rows sharing a prompt with one
            ``generate_batched`` request (one transformer batch). Default True.
        server_routing (RolloutServerRoutingConfig): how requests are spread over replicas.
        engine_start_timeout_s (float): seconds a rollout engine's start may wait for its orchestrator, stages
            and (CPU) the warm-up request's output, which runs at ``height`` x ``width``, one step. Default 1200.
        seed (int): (verl's key) base of every sample's seed, derived with the global step and row index.
    """

    name: str = "vllm_omni"
    tensor_model_parallel_size: int = 1
    agent: AgentLoopConfig = field(default_factory=_diffusion_agent_config)

    height: int = 512
    width: int = 512
    num_inference_steps: int = 10
    true_cfg_scale: float = 4.0
    negative_prompt: str = " "
    noise_level: float = 0.7
    val_noise_level: float = 0.0
    sde_type: str = "sde"
    sde_window_size: int = 2
    sde_window_range: list[int] | None = None
    model_kwargs: dict = field(default_factory=dict)
    enable_batched_diffusion: bool = True
    server_routing: RolloutServerRoutingConfig = field(default_factory=RolloutServerRoutingConfig)
    engine_start_timeout_s: float = DEFAULT_ENGINE_START_TIMEOUT_S

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.server_routing, dict | DictConfig):
            routing = (
                OmegaConf.to_container(self.server_routing)
                if isinstance(self.server_routing, DictConfig)
                else self.server_routing
            )
            routing = {k: v for k, v in routing.items() if k != "_target_"}
            object.__setattr__(self, "server_routing", RolloutServerRoutingConfig(**routing))
        if self.sde_window_range is not None:
            object.__setattr__(self, "sde_window_range", [int(v) for v in self.sde_window_range])
        if isinstance(self.model_kwargs, DictConfig):
            object.__setattr__(self, "model_kwargs", OmegaConf.to_container(self.model_kwargs, resolve=True))
        if not isinstance(self.model_kwargs, dict):
            raise ValueError(f"{KEY}.model_kwargs must be a mapping, got {type(self.model_kwargs).__name__}")
        self._check_image()
        self._check_sde()
        if self.agent.num_workers < 1:
            raise ValueError(
                f"{KEY}.agent.num_workers must be >= 1 (agent-loop workers drive the requests), got "
                f"{self.agent.num_workers}"
            )
        if self.n < 1:
            raise ValueError(f"{KEY}.n must be >= 1, got {self.n}")
        if self.val_kwargs.n < 1:
            raise ValueError(f"{KEY}.val_kwargs.n must be >= 1, got {self.val_kwargs.n}")
        if not self.engine_start_timeout_s > 0:
            raise ValueError(f"{ENGINE_START_TIMEOUT_KEY} must be > 0 seconds, got {self.engine_start_timeout_s}")

    def _check_image(self) -> None:
        for key in ("height", "width"):
            value = getattr(self, key)
            if value < IMAGE_SIDE_MULTIPLE or value % IMAGE_SIDE_MULTIPLE:
                raise ValueError(f"{KEY}.{key} must be a positive multiple of {IMAGE_SIDE_MULTIPLE}, got {value}")
        if self.num_inference_steps < 1:
            raise ValueError(f"{KEY}.num_inference_steps must be >= 1, got {self.num_inference_steps}")
        if not self.true_cfg_scale > 0:
            raise ValueError(f"{KEY}.true_cfg_scale must be > 0 (<= 1 disables CFG), got {self.true_cfg_scale}")

    def _check_sde(self) -> None:
        if self.sde_type not in SDE_TYPES:
            raise ValueError(f"{KEY}.sde_type must be one of {SDE_TYPES}, got {self.sde_type!r}")
        top = MAX_NOISE_LEVEL[self.sde_type]
        if not 0 < self.noise_level <= top:
            raise ValueError(
                f"{KEY}.noise_level must be in (0, {top:.4g}] for sde_type={self.sde_type!r} (> 0: the trained steps "
                f"are stochastic; the bound: flow_match_sde.MAX_NOISE_LEVEL), got {self.noise_level}"
            )
        if not 0 <= self.val_noise_level <= top:
            raise ValueError(
                f"{KEY}.val_noise_level must be in [0, {top:.4g}] (0 = ODE) for sde_type={self.sde_type!r}, "
                f"got {self.val_noise_level}"
            )
        steps = self.num_inference_steps
        if not 1 <= self.sde_window_size <= steps:
            raise ValueError(
                f"{KEY}.sde_window_size={self.sde_window_size} must be in [1, num_inference_steps={steps}]"
            )
        if self.sde_window_range is not None:
            if len(self.sde_window_range) != 2:
                raise ValueError(f"{KEY}.sde_window_range must be [r0, r1], got {self.sde_window_range}")
            r0, r1 = self.sde_window_range
            if not 0 <= r0 < r1 <= steps:
                raise ValueError(
                    f"{KEY}.sde_window_range={self.sde_window_range} must satisfy 0 <= r0 < r1 <= "
                    f"num_inference_steps={steps}"
                )
            if r1 - r0 < self.sde_window_size:
                raise ValueError(
                    f"{KEY}.sde_window_range={self.sde_window_range} is shorter than "
                    f"sde_window_size={self.sde_window_size}"
                )

    @property
    def window_range(self) -> list[int]:
        """``sde_window_range`` with its default ``[0, num_inference_steps]`` resolved."""
        return list(self.sde_window_range or [0, self.num_inference_steps])

    @property
    def uses_cfg(self) -> bool:
        return self.true_cfg_scale > 1.0

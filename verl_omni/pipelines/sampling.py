"""The sampling spec: the one home of the sampling settings, from the config to the request to the replay.

A rollout is reproducible only if the actor replays it with the settings it sampled with, so
the settings travel as one object: the rollout config is a :class:`SamplingSettings` (each setting's
name, default and doc, once), :class:`SamplingSpec` is built from it
(``DiffusionRolloutConfig.sampling_spec``), sent with every request as its flat field dict
(:meth:`SamplingSpec.request_params`; the engine forwards it to the rollout pipeline inside
``extra_args``), read back by the pipeline (:meth:`SamplingSpec.from_sampling_params`) and by the
actor (``meta_info["sampling_spec"]``, :meth:`SamplingSpec.from_dict`). Every check of a setting
is here, in :meth:`SamplingSpec.__post_init__` (values) and :meth:`SamplingSpec.for_model` (what
the model can honour: its latent multiple, its frame counts, its guidance style and the sampler
settings it serves, ``ModelAdapter.sampler_choices``).

Guidance styles (``ModelAdapter.guidance_style``):

* ``"true_cfg"``: two passes per step with a negative prompt, rescaled (Qwen-Image, BAGEL);
  ``true_cfg_scale`` > 1 turns it on.
* ``"cfg"``: classic two-pass CFG with a negative prompt, no rescale (SD3.5); ``true_cfg_scale``.
* ``"distilled"``: one pass per step; the guidance is an embedding input (FLUX.1-dev):
  ``guidance_scale``; ``true_cfg_scale`` must stay <= 1.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import FrozenInstanceError, asdict, dataclass, field, fields, replace
from typing import Any

from verl_omni.pipelines.schedulers.flow_match_sde import MAX_NOISE_LEVEL, SDE_TYPES
from verl_omni.pipelines.schedulers.mix_ode import ODE_SOLVER_ORDERS, ODE_SOLVERS, WINDOW_SCHEDULES

logger = logging.getLogger(__name__)

GUIDANCE_STYLES = ("true_cfg", "cfg", "distilled")
# where the spec travels inside a request's ``extra_args``
EXTRA_ARGS_KEY = "sampling_spec"
# request keys outside the spec: ``seed`` (the first sample's seed when ``seeds`` is not given; sample i gets
# seed + i) and the keys verl's agent loops send for text models (meaningless for diffusion, ignored)
REQUEST_ONLY_KEYS = ("seed",)
# spec fields a request fills in (per sample or per training step); the config and the replay leave them empty
REQUEST_FIELDS = ("seeds", "initial_noise_seeds", "global_step")
IGNORED_LLM_KEYS = ("temperature", "top_p", "top_k", "repetition_penalty", "logprobs", "max_tokens", "n")
# what every request of one transformer batch must share; seeds, noise level and window are per request
BATCH_SHARED_FIELDS = (
    "num_inference_steps",
    "height",
    "width",
    "num_frames",
    "true_cfg_scale",
    "guidance_scale",
    "sde_type",
    "model_kwargs",
    "ode_solver",
    "ode_solver_order",
    "ode_post_window_ratio",
)


@dataclass(kw_only=True)
class SamplingSettings:
    """The sampling settings a run configures: each one's name, default and meaning live here, once.

    The rollout config (``DiffusionRolloutConfig``, YAML ``actor_rollout_ref.rollout.<name>``) is a
    ``SamplingSettings`` and :class:`SamplingSpec` is one plus the fields a request fills in, so a key
    written in the config is the field the request carries and the actor replays. The values are
    checked where a spec is built (:meth:`SamplingSpec.__post_init__`, :meth:`SamplingSpec.for_model`).

    Args:
        num_inference_steps (int): denoising steps T. Default 10.
        height (int): image height in pixels, a multiple of the model's ``latent_multiple`` (16 for Qwen-Image,
            BAGEL). Default 512.
        width (int): image width in pixels, a multiple of the model's ``latent_multiple``. Default 512.
        num_frames (int): frames per sample: 1 for an image model; ``frame_multiple·k + 1`` for a video model (its
            VAE's temporal compression, ``ModelAdapter.frame_multiple``; Wan2.2: 1, 5, 9, ...). Default 1.
        noise_level (float): SDE noise level a inside the window, at most ``flow_match_sde.MAX_NOISE_LEVEL`` of the
            ``sde_type`` (sqrt(2) for ``sde``, 1 for ``cps``); 0 samples the ODE and records the clean latents (the
            ``ode_samples`` record of DiffusionNFT; an SDE-window algorithm refuses it). Default 0.7.
        sde_type (str): the stochastic step, one of ``flow_match_sde.SDE_TYPES`` (``"sde"``, ``"cps"`` of Flow-GRPO,
            ``"dance"`` of DanceGRPO). Default ``"sde"``.
        true_cfg_scale (float | None): CFG scale with a negative prompt (``"true_cfg"``/``"cfg"`` models); > 1 sends
            the negative prompt and records its conditioning, <= 1 is off. Default None: the model's
            ``default_true_cfg_scale`` (Qwen-Image, BAGEL: 4.0; 1.0 when no model is known).
        model_kwargs (dict): model-specific settings, sent with every request and replayed by the actor: the keys of
            the adapter's ``sampling_keys`` (BAGEL: ``timestep_shift``, ``cfg_img_scale``, ``cfg_interval``,
            ``cfg_renorm_type``, ``cfg_renorm_min``). Default empty: the model's defaults.
        guidance_scale (float | None): the guidance embedding of a ``"distilled"`` model (FLUX.1-dev). Default None:
            the model's default; a model without one refuses any other value.
        sde_window_size (int | None): W, stochastic (recorded, trained) steps per sample, 1 <= W <= T. Default 2;
            None: the whole window range, ``r1 - r0`` (so it follows the model's ``max_sde_window_end``).
        sde_window_range (Sequence[int] | None): ``[r0, r1]``, the steps a window may cover. Default None:
            ``[0, T]`` (or the model's last step it can take an SDE step at, ``ModelAdapter.max_sde_window_end``).
        same_initial_noise (bool): every sample of a prompt group starts from the same initial noise (DanceGRPO's
            ``init_same_noise``): the request carries ``initial_noise_seeds``, the group's first seed for each
            sample; the SDE noise stays per sample. Default False.
        sde_window_schedule (str): where a sample's window lies: ``"random"`` (Flow-GRPO: seeded per sample in
            ``[r0, r1 − W]``) or ``"progressive"`` (MixGRPO: the same window for every sample, sliding with
            ``global_step``, ``mix_ode.progressive_window_start``). Default ``"random"``.
        sde_window_stride (int): ``"progressive"``: steps the window moves per shift; 0 keeps it at r0. Default 1.
        sde_window_shift_every (int): ``"progressive"``: training steps between two shifts. Default 25.
        ode_solver (str): the ODE after the window: ``"euler"`` or ``"dpmsolver++"`` (MixGRPO-Flash). Steps before
            and between windows are always Euler. Default ``"euler"``.
        ode_solver_order (int): order of ``"dpmsolver++"``, 1 or 2. Default 2.
        ode_post_window_ratio (float): share of the steps after the window that the ODE takes, in (0, 1]
            (MixGRPO-Flash's compression, ``mix_ode.post_window_indices``); below 1 saves model calls. Default 1.0
            (off: its effect on the reward is not shown neutral yet).
            "After the window" (for both ODE keys) means after the last step any sample's window may cover, so the
            thinned schedule is one for the whole transformer batch: the shared window's end (``"progressive"``),
            or r1, the end of ``sde_window_range`` (``"random"``: every window ends by r1 whatever its seed, so
            r1 must be < T). No step a window may cover changes: the recorded steps and log-probs stay exact.
    """

    num_inference_steps: int = 10
    height: int = 512
    width: int = 512
    num_frames: int = 1
    noise_level: float = 0.7
    sde_type: str = "sde"
    true_cfg_scale: float | None = None
    model_kwargs: Mapping[str, Any] = field(default_factory=dict)
    guidance_scale: float | None = None
    sde_window_size: int | None = 2
    sde_window_range: Sequence[int] | None = None
    same_initial_noise: bool = False
    sde_window_schedule: str = "random"
    sde_window_stride: int = 1
    sde_window_shift_every: int = 25
    ode_solver: str = "euler"
    ode_solver_order: int = 2
    ode_post_window_ratio: float = 1.0

    def sampling_settings(self) -> dict[str, Any]:
        """This object's sampling settings by name (a config's, to build a :class:`SamplingSpec` from)."""
        return {f.name: getattr(self, f.name) for f in fields(SamplingSettings)}


@dataclass(kw_only=True)
class SamplingSpec(SamplingSettings):
    """How a rollout samples (and so how the actor must replay it): the :class:`SamplingSettings`, checked and
    resolved (``true_cfg_scale`` None is 1.0 here, ``sde_window_range`` a tuple; :meth:`resolve` gives the model's
    defaults), plus the fields a request fills in. Immutable: :func:`dataclasses.replace` makes a changed copy.

    Args:
        seeds (tuple[int, ...]): one seed per sample of a request (empty in the config and the replay).
        initial_noise_seeds (tuple[int, ...]): per sample, the seed of its initial noise; empty: its own seed.
        global_step (int): the trainer step a request samples for (the progressive window); 0 in the config.
    """

    seeds: tuple[int, ...] = ()
    initial_noise_seeds: tuple[int, ...] = ()
    global_step: int = 0

    def __setattr__(self, name: str, value: Any) -> None:
        # a spec travels with requests and batches: a field set once (in __init__) stays
        if name in self.__dict__:
            raise FrozenInstanceError(f"cannot assign to field {name!r}: a SamplingSpec is immutable (use replace)")
        super().__setattr__(name, value)

    def __post_init__(self):
        # normalize containers (YAML lists, OmegaConf nodes, numpy ints) so that equal specs compare equal
        if self.true_cfg_scale is None:
            object.__setattr__(self, "true_cfg_scale", 1.0)
        if self.sde_window_range is not None:
            object.__setattr__(self, "sde_window_range", tuple(int(v) for v in self.sde_window_range))
        if self.sde_window_size is None:
            # the whole range the model can take SDE steps in: a model-independent default that never overflows it
            r0, r1 = self.window_range
            object.__setattr__(self, "sde_window_size", r1 - r0)
        object.__setattr__(self, "seeds", tuple(int(s) for s in self.seeds))
        object.__setattr__(self, "initial_noise_seeds", tuple(int(s) for s in self.initial_noise_seeds))
        if not isinstance(self.model_kwargs, Mapping):
            raise ValueError(f"model_kwargs must be a mapping, got {type(self.model_kwargs).__name__}")
        object.__setattr__(self, "model_kwargs", dict(self.model_kwargs))
        self._check_values()

    def _check_values(self) -> None:
        steps = self.num_inference_steps
        if not isinstance(steps, int) or steps < 1:
            raise ValueError(f"num_inference_steps must be an integer >= 1, got {steps!r}")
        for key in ("height", "width", "num_frames"):
            if not isinstance(getattr(self, key), int) or getattr(self, key) < 1:
                raise ValueError(f"{key} must be a positive integer, got {getattr(self, key)!r}")
        if self.sde_type not in SDE_TYPES:
            raise ValueError(f"sde_type must be one of {SDE_TYPES}, got {self.sde_type!r}")
        top = MAX_NOISE_LEVEL[self.sde_type]
        if not 0 <= self.noise_level <= top:
            raise ValueError(
                f"noise_level must be in [0, {top:.4g}] for sde_type={self.sde_type!r} (0 = ODE, nothing recorded; "
                f"the bound: flow_match_sde.MAX_NOISE_LEVEL), got {self.noise_level}"
            )
        if not self.true_cfg_scale > 0:
            raise ValueError(f"true_cfg_scale must be > 0 (<= 1 disables CFG), got {self.true_cfg_scale}")
        if self.guidance_scale is not None and not self.guidance_scale > 0:
            raise ValueError(f"guidance_scale must be > 0 or null, got {self.guidance_scale}")
        if not 1 <= self.sde_window_size <= steps:
            raise ValueError(f"sde_window_size={self.sde_window_size} must be in [1, num_inference_steps={steps}]")
        if self.sde_window_range is not None:
            if len(self.sde_window_range) != 2:
                raise ValueError(f"sde_window_range must be [r0, r1], got {list(self.sde_window_range)}")
            r0, r1 = self.sde_window_range
            if not 0 <= r0 < r1 <= steps:
                raise ValueError(
                    f"sde_window_range={list(self.sde_window_range)} must satisfy 0 <= r0 < r1 <= "
                    f"num_inference_steps={steps}"
                )
            if r1 - r0 < self.sde_window_size:
                raise ValueError(
                    f"sde_window_range={list(self.sde_window_range)} is shorter than "
                    f"sde_window_size={self.sde_window_size}"
                )
        self._check_window_schedule()
        self._check_ode()

    def _check_window_schedule(self) -> None:
        if self.sde_window_schedule not in WINDOW_SCHEDULES:
            raise ValueError(f"sde_window_schedule must be one of {WINDOW_SCHEDULES}, got {self.sde_window_schedule!r}")
        if not isinstance(self.sde_window_stride, int) or self.sde_window_stride < 0:
            raise ValueError(f"sde_window_stride must be an integer >= 0, got {self.sde_window_stride!r}")
        if not isinstance(self.sde_window_shift_every, int) or self.sde_window_shift_every < 1:
            raise ValueError(f"sde_window_shift_every must be an integer >= 1, got {self.sde_window_shift_every!r}")
        if not isinstance(self.global_step, int) or self.global_step < 0:
            raise ValueError(f"global_step must be an integer >= 0, got {self.global_step!r}")
        if self.initial_noise_seeds and len(self.initial_noise_seeds) != len(self.seeds):
            raise ValueError(
                f"initial_noise_seeds has {len(self.initial_noise_seeds)} seeds for {len(self.seeds)} samples"
            )

    def _check_ode(self) -> None:
        if self.ode_solver not in ODE_SOLVERS:
            raise ValueError(f"ode_solver must be one of {ODE_SOLVERS}, got {self.ode_solver!r}")
        if self.ode_solver_order not in ODE_SOLVER_ORDERS:
            raise ValueError(f"ode_solver_order must be one of {ODE_SOLVER_ORDERS}, got {self.ode_solver_order!r}")
        if not 0 < self.ode_post_window_ratio <= 1:
            raise ValueError(f"ode_post_window_ratio must be in (0, 1], got {self.ode_post_window_ratio}")
        r1 = self.window_range[1]
        if self.changes_post_window_ode and self.sde_window_schedule == "random" and r1 == self.num_inference_steps:
            raise ValueError(
                f"ode_solver={self.ode_solver!r}, ode_post_window_ratio={self.ode_post_window_ratio}: with "
                "sde_window_schedule='random' the ODE is changed only after sde_window_range's end r1 (every "
                f"sample's window ends by then, whatever its seed), and r1={r1} = num_inference_steps leaves no step "
                "after it; allowed: sde_window_range=[r0, r1] with r1 < num_inference_steps (e.g. [0, 5] of 10 steps), "
                "sde_window_schedule='progressive', or ode_solver='euler' with ode_post_window_ratio=1.0"
            )

    # ---- derived ---------------------------------------------------------------------------------

    @property
    def uses_cfg(self) -> bool:
        """Whether a negative prompt is sampled (and recorded, and replayed)."""
        return self.true_cfg_scale > 1.0

    @property
    def changes_post_window_ode(self) -> bool:
        """Whether the steps after the window differ from the plain Euler ODE on the full schedule (Flash)."""
        return self.ode_solver != "euler" or self.ode_post_window_ratio < 1.0

    def post_window_start(self, window_start: int) -> int:
        """The first step no sample's window can cover, whatever its seed (where :attr:`changes_post_window_ode`
        takes over): the end of the window starting at ``window_start`` when every sample shares it
        (``"progressive"``), else r1, the end of ``sde_window_range`` (a random window ends by r1 at the latest)."""
        if self.sde_window_schedule == "progressive":
            return window_start + self.sde_window_size
        return self.window_range[1]

    @property
    def window_range(self) -> tuple[int, int]:
        """``sde_window_range`` with its default ``(0, num_inference_steps)`` resolved."""
        return self.sde_window_range or (0, self.num_inference_steps)

    def require_stochastic(self) -> SamplingSpec:
        """The spec of trained (replayed) steps: the noise level must be > 0."""
        if not self.noise_level > 0:
            raise ValueError(f"noise_level must be > 0 (the trained steps are stochastic), got {self.noise_level}")
        return self

    # ---- the model's facts -----------------------------------------------------------------------

    @classmethod
    def resolve(cls, values: Mapping[str, Any], adapter=None, model: str = "") -> SamplingSpec:
        """A spec from ``values`` (null ``true_cfg_scale``/``guidance_scale`` = the model's default), checked
        against ``adapter`` when given (:meth:`for_model`). Errors name the bare key (callers prefix theirs)."""
        values = dict(values)
        if values.get("true_cfg_scale") is None:
            values["true_cfg_scale"] = adapter.default_true_cfg_scale if adapter is not None else 1.0
        if values.get("guidance_scale") is None and adapter is not None:
            values["guidance_scale"] = adapter.default_guidance_scale
        if values.get("sde_window_range") is None and adapter is not None:
            steps = values.get("num_inference_steps", cls.num_inference_steps)
            end = adapter.max_sde_window_end(steps) if isinstance(steps, int) else steps
            if end != steps:
                values["sde_window_range"] = (0, end)
        spec = cls(**values)
        return spec if adapter is None else spec.for_model(adapter, model)

    def for_model(self, adapter, model: str = "") -> SamplingSpec:
        """Refuse what ``adapter``'s model cannot honour, naming the key, the model and the allowed values."""
        name = f"{adapter.__name__}" + (f" ({model})" if model else "")
        missing = [fact for fact in ("latent_multiple", "guidance_style") if not hasattr(adapter, fact)]
        if missing:
            raise TypeError(f"{adapter.__name__} must declare the model facts {missing} (see ModelAdapter)")
        multiple = adapter.latent_multiple
        for key in ("height", "width"):
            value = getattr(self, key)
            if value % multiple:
                raise ValueError(
                    f"{key}={value}: {name} needs image sides that are positive multiples of {multiple} "
                    f"(e.g. {max(multiple, value // multiple * multiple)} or {(value // multiple + 1) * multiple})"
                )
        self._check_frames(adapter, name)
        style = adapter.guidance_style
        if style not in GUIDANCE_STYLES:
            raise ValueError(f"{adapter.__name__}.guidance_style={style!r} must be one of {GUIDANCE_STYLES}")
        if style == "distilled" and self.uses_cfg:
            raise ValueError(
                f"true_cfg_scale={self.true_cfg_scale}: {name} is guidance-distilled (one pass per step, no negative "
                f"prompt); allowed: true_cfg_scale <= 1 or null; set guidance_scale "
                f"(default {adapter.default_guidance_scale}) instead"
            )
        if style != "distilled" and self.guidance_scale is not None:
            raise ValueError(
                f"guidance_scale={self.guidance_scale}: {name} has no guidance embedding ({style} guidance); "
                "allowed: null; set true_cfg_scale instead"
            )
        end = adapter.max_sde_window_end(self.num_inference_steps)
        if self.window_range[1] > end:
            raise ValueError(
                f"sde_window_range={list(self.window_range)}: {name} cannot take an SDE step past step {end} of "
                f"num_inference_steps={self.num_inference_steps}; allowed: r1 <= {end} (null picks [0, {end}])"
            )
        for key, choices in adapter.sampler_choices.items():
            if getattr(self, key) not in choices:
                raise ValueError(
                    f"{key}={getattr(self, key)!r}: {name} does not serve this sampler setting (its rollout pipeline "
                    f"cannot run it: {adapter.__name__}.sampler_choices); allowed: {list(choices)}"
                )
        unknown = sorted(set(self.model_kwargs) - set(adapter.sampling_keys))
        if unknown:
            raise ValueError(
                f"model_kwargs has keys {unknown} that {name} does not read; allowed: {list(adapter.sampling_keys)}"
            )
        return self

    def _check_frames(self, adapter, name: str) -> None:
        """``num_frames`` against the model's temporal compression (``adapter.frame_multiple``; None: images only)."""
        multiple = getattr(adapter, "frame_multiple", None)
        if multiple is None and self.num_frames != 1:
            raise ValueError(f"num_frames={self.num_frames}: {name} generates images; allowed: 1")
        if multiple is not None and (self.num_frames - 1) % multiple:
            below = (self.num_frames - 1) // multiple * multiple + 1
            raise ValueError(
                f"num_frames={self.num_frames}: {name} needs num_frames = {multiple}k + 1 (its VAE compresses "
                f"{multiple} frames into one latent frame after the first); allowed: 1, {multiple + 1}, "
                f"{2 * multiple + 1}, ... (e.g. {below} or {below + multiple})"
            )

    # ---- travel ----------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain Python values (lists for tuples): what travels in a request or a ``DataProto.meta_info``."""
        out = asdict(self)
        out["seeds"] = list(self.seeds)
        out["initial_noise_seeds"] = list(self.initial_noise_seeds)
        if self.sde_window_range is not None:
            out["sde_window_range"] = list(self.sde_window_range)
        return out

    def request_params(self, seeds: list[int] | None = None) -> dict[str, Any]:
        """The flat ``sampling_params`` of one request: the spec's fields, with the samples' ``seeds``."""
        spec = self if seeds is None else replace(self, seeds=tuple(seeds))
        return spec.to_dict()

    def replay(self) -> SamplingSpec:
        """The spec the actor replays with: per-request fields dropped (an SDE-window replay also requires the
        trained steps stochastic, ``replay.check_replay_batch``; an ODE-samples replay has noise level 0)."""
        return replace(self, seeds=(), initial_noise_seeds=(), global_step=0)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any] | SamplingSpec) -> SamplingSpec:
        """Back from :meth:`to_dict` (or a spec, unchanged); unknown keys are refused, naming the known ones."""
        if isinstance(values, SamplingSpec):
            return values
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"sampling settings have unknown keys {unknown}; known: {sorted(known)}")
        return cls(**values)

    @classmethod
    def from_request_params(cls, params: Mapping[str, Any], adapter=None) -> tuple[SamplingSpec, int | None]:
        """``(spec, seed)`` of a request's flat ``sampling_params`` (verl's text-model keys ignored), resolved
        and checked for ``adapter``'s model when given (:meth:`resolve`)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(params) - known - set(REQUEST_ONLY_KEYS) - set(IGNORED_LLM_KEYS))
        if unknown:
            raise ValueError(
                f"sampling_params has unknown keys {unknown}; sampling keys: {sorted(known)}, "
                f"request keys: {list(REQUEST_ONLY_KEYS)} (model-specific keys go in 'model_kwargs')"
            )
        values = {k: params[k] for k in known if params.get(k) is not None}
        seed = params.get("seed")
        return cls.resolve(values, adapter), (None if seed is None else int(seed))

    @classmethod
    def from_sampling_params(cls, sampling_params) -> SamplingSpec:
        """The spec a request to the rollout pipeline carries (``extra_args['sampling_spec']``)."""
        extra = sampling_params.extra_args or {}
        if EXTRA_ARGS_KEY not in extra:
            raise ValueError(
                f"the request's extra_args lack {EXTRA_ARGS_KEY!r}: build rollout requests with "
                "verl_omni.workers.rollout.vllm_omni.engine.build_sampling_params (it carries the sampling spec)"
            )
        return cls.from_dict(extra[EXTRA_ARGS_KEY])


def shared_spec(specs: list[SamplingSpec]) -> SamplingSpec:
    """The settings the requests of one transformer batch share (:data:`BATCH_SHARED_FIELDS`), from the first;
    a difference is refused, naming the field."""
    for name in BATCH_SHARED_FIELDS:
        values = [getattr(s, name) for s in specs]
        if any(v != values[0] for v in values[1:]):
            raise ValueError(f"requests batched together must share the sampling spec's {name}, got {values}")
    return specs[0]

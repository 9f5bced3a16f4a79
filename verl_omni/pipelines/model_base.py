"""Model adapters: what the trainer and the rollout need to know about one architecture.

A model is three things that must agree with each other:

* a rollout pipeline: a vLLM-Omni custom pipeline class (``rollout_pipeline``, a dotted path)
  that samples with the shared SDE step and records the trajectory and its log-probs;
* a training adapter: builds the trainable module from the same checkpoint, declares its FSDP
  wrap blocks and LoRA targets, states which recorded tensors a replay needs, predicts the
  velocity of one recorded step, and maps trained weight names onto the rollout's modules;
* scheduler settings: the rollout's sigma schedule, rebuilt by the trainer to replay steps.

Adapters are classes whose attributes state facts and whose class methods do the work;
:class:`ModelAdapter` is the base with the parts every model shares. They are registered by
architecture name (``model_index.json``'s ``_class_name`` for diffusers checkpoints,
``config.json``'s ``architectures[0]`` otherwise) and declare what their rollout can record (and so
which algorithms they can serve).
Engines look the adapter up here; nothing in the trainer tests an architecture name.

Registration keeps no list (``docs/extending/model.md``): a built-in model is a package
``verl_omni/pipelines/<model>/`` whose ``training_adapter.py`` decorates its adapter with
``@register_model_adapter("<architecture>")``; every such module is imported on the first lookup.
An out-of-tree model is an installed distribution with an entry point in the group
:data:`ADAPTER_ENTRY_POINT_GROUP` named by the architecture, ``<architecture> = "<module>:<AdapterClass>"``,
loaded on the first lookup of that architecture.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch

from verl_omni.utils.registry import Registry, import_submodules

# the package whose model subpackages hold the built-in adapters, and the module each one registers in
PIPELINES_PACKAGE = "verl_omni.pipelines"
ADAPTER_MODULE = "training_adapter"
ADAPTER_ENTRY_POINT_GROUP = "verl_omni.model_adapters"

# what a rollout pipeline can record per sample, besides the image and the conditioning tensors
# (an algorithm declares the one it needs, ``verl_omni.algorithms``):
# SDE_WINDOW: the W+1 latents, W log-probs and W timesteps of an SDE window (docs/design.md, "Data contracts");
# ODE_SAMPLES: the clean final latents of a deterministic sample, no log-probs
SDE_WINDOW = "sde_window"
ODE_SAMPLES = "ode_samples"
ROLLOUT_RECORDS = (SDE_WINDOW, ODE_SAMPLES)


def _import_builtin_adapters() -> None:
    """Import ``verl_omni.pipelines.<model>.training_adapter`` of every model package (each registers itself)."""
    import_submodules(PIPELINES_PACKAGE, ADAPTER_MODULE)


def _is_adapter_class(obj: object) -> bool:
    return inspect.isclass(obj) and issubclass(obj, ModelAdapter)


MODEL_ADAPTERS: Registry = Registry(
    "model adapter",
    check=_is_adapter_class,
    discover=_import_builtin_adapters,
    entry_point_group=ADAPTER_ENTRY_POINT_GROUP,
    how_to_add=(
        f"Add a model as a package {PIPELINES_PACKAGE.replace('.', '/')}/<model>/ whose {ADAPTER_MODULE}.py "
        "decorates a ModelAdapter subclass with @register_model_adapter('<architecture>'), or install a "
        f"package declaring an entry point in group {ADAPTER_ENTRY_POINT_GROUP!r}: "
        "'<architecture> = \"<module>:<AdapterClass>\"' (docs/extending/model.md)."
    ),
)


class ModelAdapter:
    """Base of every training adapter (see module docstring); subclasses fill in the facts and methods.

    Class attributes:
        rollout_pipeline (`str`): dotted path of the vLLM-Omni custom pipeline class of this model.
        rollout_records (`tuple[str]`): what the rollout pipeline can record (:data:`ROLLOUT_RECORDS`); an
            algorithm needing another record is refused for this model before Ray starts.
        algorithms (`tuple[str]` or None): restricts the RL algorithms (registered names) the model supports;
            None: every algorithm whose record is in ``rollout_records``.
        sampler_choices (`Mapping[str, tuple]`): sampler settings (``SamplingSpec`` fields, the config's
            ``actor_rollout_ref.rollout.<key>``) of which the rollout pipeline serves only some values: key -> the
            values it serves. A key not listed takes every value the sampling spec allows. Checked with the
            model's other facts (``SamplingSpec.for_model``), so a sampler the model cannot run (e.g. an
            algorithm's) is refused before Ray starts, naming the key, the model and these values.
        fsdp_wrap_blocks (`tuple[str]`): module class names wrapped one FSDP unit each.
        lora_target_modules (`tuple[str]`): default peft ``target_modules``.
        lora_exclude_modules (`str` or None): peft ``exclude_modules`` of every LoRA the engine adds (a regular
            expression a module's full name must match entirely): modules whose names a target matches but that the
            rollout's transformer keeps as plain layers its LoRA manager cannot bind (HunyuanVideo-1.5's token
            refiner). None: none.
        lora_file_pipeline (`str` or None): diffusers pipeline whose LoRA file format checkpoints use.
        lora_components (`tuple[str]`): a training module holding several transformers (the A14B's two experts):
            their attribute names, which are the pipeline's component names and the first part of every LoRA
            tensor name; the checkpoint writes one diffusers LoRA file per component
            (``workers/engine/fsdp/checkpoint.py``). Empty: the module is the one transformer.
        conditioning_keys (`tuple[str]`): per-sample tensors (besides latents and timesteps) a replay needs.
        cfg_conditioning_keys (`tuple[str]`): further ones when the replay uses CFG.
        rollout_name_map (`tuple[tuple[str, str]]`): ``(training, rollout)`` name fragments, applied to
            ``.``-delimited names in order, that turn a trained module name into the rollout's.
        rollout_weight_prefix (`str` or None): the rollout pipeline's component holding the trained module, as the
            prefix its ``load_weights`` routes checkpoint names by (``"transformer."``); full fine-tuning sends the
            trained module's own (diffusers) names under it and the rollout's loader maps them (fused qkv...).
            None: the model has no full-weight sync (LoRA only).
        rollout_fused_lora_modules (`tuple[tuple[str, tuple[str]]]`): ``(fused layer, sub-layers in slice order)``
            (leaf names, or trailing paths such as ``attn1.to_q`` when only some layers of that leaf name are fused;
            rollout naming) of fused rollout layers whose sub-layer adapters vLLM-Omni's LoRA manager
            does not route itself (it derives that routing from the model's ``stacked_params_mapping``; a model
            without one lists its fused layers here): :meth:`rollout_lora` fuses those adapters into one
            (:mod:`verl_omni.pipelines.rollout_lora`).
        sampling_keys (`tuple[str]`): model-specific sampling settings the rollout pipeline and the replay
            read (``rollout.model_kwargs``, sent as request ``extra_args`` and as ``SamplingSpec.model_kwargs``).
        tokenizer_subfolder (`str`): folder of the checkpoint holding the prompt tokenizer ('' = its root).
        rollout_dtype (`str` or None): the dtype vLLM-Omni's pipeline of this model computes in on every
            device, whatever the rollout config says; None: the configured dtype (fp32 on CPU).
        latent_multiple (`int`): image sides must be multiples of it (VAE downsampling x latent patch size).
        video_fps (`int`): frames per second a video model's samples play at (validation mp4s). Default 16.
        latent_ndim (`int`): dims of one sample's recorded latent at one step: 2 for packed image tokens
            ``[S, C]`` (every image model), 4 for a video latent ``[C, F', h, w]``.
        frame_multiple (`int` or None): a video model's frames per latent frame (its VAE's temporal compression):
            ``num_frames`` must be ``frame_multiple·k + 1``; None: an image model (``num_frames`` must be 1).
        guidance_style (`str`): ``"true_cfg"`` (negative prompt, rescaled), ``"cfg"`` (classic, negative prompt)
            or ``"distilled"`` (a guidance embedding, one pass per step); see :mod:`verl_omni.pipelines.sampling`.
        default_true_cfg_scale (`float`): ``true_cfg_scale`` when the config leaves it null (<= 1: no CFG).
        default_guidance_scale (`float` or None): ``guidance_scale`` when the config leaves it null (distilled only).
        max_source_images (`int`): source images a prompt row carries (an editing model's, ``data.image_key``);
            0: text-to-image, the rows' images are not sent.
        supports_sequence_parallel (`bool`): the replay may split each sample's tokens over the ranks of a
            sequence-parallel group (``actor.ulysses_sequence_parallel_size`` > 1, :meth:`enable_sequence_parallel`);
            False: the trainer refuses such a degree before Ray starts.
        rollout_supports_sequence_parallel (`bool`): the rollout engine may split each sample's tokens over the
            workers of a replica (``rollout.ulysses_sequence_parallel_size`` > 1, vLLM-Omni's ``ulysses_degree``):
            the model's vLLM-Omni transformer declares a sequence-parallel plan (``_sp_plan``) and our rollout
            pipeline keeps it; False: the trainer refuses such a degree before Ray starts.
        preference_encoder (`str` or None): dotted path of the class that turns offline preference pairs (prompt,
            image) into what the ``ode_samples`` replay reads (``data.preference_files``, offline Diffusion-DPO):
            ``cls(model_path, device, dtype)`` with ``encode(prompts, images, height, width)`` returning
            ``clean_latents`` and the conditioning tensors per sample. None: the model trains on no preference file
            (refused before Ray starts).
    """

    rollout_pipeline: ClassVar[str]
    rollout_records: ClassVar[tuple[str, ...]] = (SDE_WINDOW,)
    algorithms: ClassVar[tuple[str, ...] | None] = None
    sampler_choices: ClassVar[Mapping[str, tuple[Any, ...]]] = {}
    fsdp_wrap_blocks: ClassVar[tuple[str, ...]] = ()
    lora_target_modules: ClassVar[tuple[str, ...]] = ()
    lora_exclude_modules: ClassVar[str | None] = None
    lora_file_pipeline: ClassVar[str | None] = None
    lora_components: ClassVar[tuple[str, ...]] = ()
    conditioning_keys: ClassVar[tuple[str, ...]] = ()
    cfg_conditioning_keys: ClassVar[tuple[str, ...]] = ()
    rollout_name_map: ClassVar[tuple[tuple[str, str], ...]] = ()
    rollout_fused_lora_modules: ClassVar[tuple[tuple[str, tuple[str, ...]], ...]] = ()
    rollout_weight_prefix: ClassVar[str | None] = "transformer."
    sampling_keys: ClassVar[tuple[str, ...]] = ()
    tokenizer_subfolder: ClassVar[str] = ""
    rollout_dtype: ClassVar[str | None] = None
    latent_multiple: ClassVar[int]
    frame_multiple: ClassVar[int | None] = None
    latent_ndim: ClassVar[int] = 2
    video_fps: ClassVar[int] = 16
    guidance_style: ClassVar[str]
    default_true_cfg_scale: ClassVar[float] = 1.0
    default_guidance_scale: ClassVar[float | None] = None
    max_source_images: ClassVar[int] = 0
    supports_sequence_parallel: ClassVar[bool] = False
    rollout_supports_sequence_parallel: ClassVar[bool] = False
    preference_encoder: ClassVar[str | None] = None

    @classmethod
    def for_checkpoint(cls, model_path: str | Path) -> type[ModelAdapter]:
        """The adapter of this checkpoint: this class, or a variant of it when checkpoints of one architecture name
        differ in layout (Wan2.2's ``WanPipeline``: one transformer or two experts). Read files only, no weights."""
        return cls

    # ---- prompts -------------------------------------------------------------------------------

    @classmethod
    def prompt_token_ids(cls, tokenizer, prompt: str) -> list[int]:
        """The ``prompt_token_ids`` the rollout pipeline expects for a text prompt (the model's template applied)."""
        raise NotImplementedError(f"{cls.__name__} does not tokenize prompts")

    # ---- building ------------------------------------------------------------------------------

    @classmethod
    def build_preference_encoder(cls, model_path: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32):
        """The model's encoder of offline preference pairs (:attr:`preference_encoder`), loaded on ``device``."""
        if cls.preference_encoder is None:
            raise ValueError(f"{cls.__name__} has no preference encoder: it cannot train on data.preference_files")
        module, _, name = cls.preference_encoder.rpartition(".")
        return getattr(importlib.import_module(module), name)(model_path, device, dtype)

    @classmethod
    def build_module(cls, model_path: str | Path, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
        """The trainable module, loaded from the checkpoint the rollout serves."""
        raise NotImplementedError(f"{cls.__name__} does not build a training module")

    @classmethod
    def build_scheduler(cls, model_path: str | Path):
        """The flow-match scheduler whose sigmas the replay steps with (schedule set by :meth:`set_schedule`)."""
        raise NotImplementedError(f"{cls.__name__} does not build a scheduler")

    @classmethod
    def set_schedule(cls, scheduler, spec, image_seq_len: int) -> None:
        """Set ``scheduler`` to the schedule the rollout sampled ``spec`` with."""
        raise NotImplementedError(f"{cls.__name__} does not set a schedule")

    @staticmethod
    def vae_scale_factor(model_path: str | Path) -> int:
        """Pixels per latent cell of the checkpoint (models that do not need it return 1)."""
        return 1

    @classmethod
    def max_sde_window_end(cls, num_inference_steps: int) -> int:
        """One past the last step an SDE window may cover (``sde_window_range[1]`` at most): less than
        ``num_inference_steps`` for a schedule whose last step the SDE kernel cannot take (Z-Image's σ = 0 → 0)."""
        return num_inference_steps

    @classmethod
    def attention_heads(cls, model_path: str | Path) -> int:
        """Attention heads of the trained transformer: a sequence-parallel degree must divide them."""
        from verl_omni.pipelines.sequence_parallel import attention_heads

        return attention_heads(model_path, getattr(cls, "transformer_subfolder", "transformer"))

    @classmethod
    def enable_sequence_parallel(cls, module: torch.nn.Module, mesh) -> None:
        """Split ``module``'s sequence over ``mesh``'s ulysses ranks (diffusers' context parallelism,
        :mod:`verl_omni.pipelines.sequence_parallel`); a model whose transformer needs more overrides it."""
        from verl_omni.pipelines.sequence_parallel import enable_ulysses

        enable_ulysses(module, mesh)

    # ---- replay --------------------------------------------------------------------------------

    @classmethod
    def required_keys(cls, uses_cfg: bool) -> tuple[str, ...]:
        """The conditioning tensors a replay batch must carry."""
        return cls.conditioning_keys + (cls.cfg_conditioning_keys if uses_cfg else ())

    @classmethod
    def recorded_keys(cls) -> tuple[str, ...]:
        """Every per-sample conditioning tensor a rollout may record (``[L, ...]`` each, right-padded to a batch)."""
        return cls.conditioning_keys + tuple(k for k in cls.cfg_conditioning_keys if k not in cls.conditioning_keys)

    @classmethod
    def check_latents(cls, latents: torch.Tensor, timesteps: torch.Tensor) -> None:
        """Shape check of the recorded ``all_latents`` ``[B, W+1, ...]`` (one sample's latent ``latent_ndim``-D: packed
        tokens ``[S, C]`` for images, ``[C, F', h, w]`` for video) against ``all_timesteps`` ``[B, W]``."""
        if (
            latents.ndim != 2 + cls.latent_ndim
            or timesteps.ndim != 2
            or latents.shape[:2] != (timesteps.shape[0], timesteps.shape[1] + 1)
        ):
            raise ValueError(
                f"all_latents {tuple(latents.shape)} must be [B, W+1] + a {cls.latent_ndim}-D latent per step "
                f"({cls.__name__}.latent_ndim) for all_timesteps {tuple(timesteps.shape)} [B, W]"
            )

    @classmethod
    def schedule_seq_len(cls, latents: torch.Tensor) -> int:
        """The transformer's token count of one step's latents ``[B, ...]`` (μ of a resolution-dependent shift):
        ``S`` of packed ``[B, S, C]`` tokens; a model with another latent layout overrides it."""
        return int(latents.shape[1])

    @classmethod
    def step_velocity(
        cls, module, batch: Mapping[str, torch.Tensor], step: int, spec, vae_scale_factor: int
    ) -> torch.Tensor:
        """Velocity (after CFG) the policy ``module`` predicts at recorded step ``step`` of every sample of ``batch``."""
        raise NotImplementedError(f"{cls.__name__} does not predict velocities")

    # ---- export to the rollout -----------------------------------------------------------------

    @classmethod
    def rollout_name(cls, name: str) -> str:
        """A trained module or weight name as the rollout pipeline names it (see ``rollout_name_map``)."""
        padded = f".{name}."
        for training_part, rollout_part in cls.rollout_name_map:
            padded = padded.replace(training_part, rollout_part)
        return padded[1:-1]

    @classmethod
    def rollout_peft_config(cls, config: dict[str, Any]) -> dict[str, Any]:
        """A peft config dict with ``target_modules`` renamed for the rollout."""
        out = dict(config)
        if isinstance(out.get("target_modules"), (list, tuple, set)):
            out["target_modules"] = sorted({cls.rollout_name(m) for m in out["target_modules"]})
        return out

    @classmethod
    def rollout_lora(
        cls, tensors: Mapping[str, torch.Tensor], peft_config: Mapping[str, Any]
    ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """A trained LoRA (peft state-dict names, peft config dict) as the rollout engine loads it: the
        config and ``base_model.model.<rollout module>.lora_{A,B}.weight`` tensors, fused layers fused. The
        one form of both the in-memory sync and the checkpoint's PEFT layout (:mod:`verl_omni.pipelines.rollout_lora`)."""
        from verl_omni.pipelines.rollout_lora import to_rollout_lora

        return to_rollout_lora(cls, tensors, peft_config)


register_model_adapter = MODEL_ADAPTERS.register


def architecture_name(model_path: str | Path) -> str:
    """The architecture of a checkpoint directory: diffusers ``model_index.json`` ``_class_name``, else
    ``config.json`` ``architectures[0]`` (BAGEL and other non-diffusers checkpoints)."""
    root = Path(model_path)
    index = root / "model_index.json"
    if index.is_file():
        return json.loads(index.read_text())["_class_name"]
    config = root / "config.json"
    if config.is_file():
        architectures = json.loads(config.read_text()).get("architectures") or []
        if architectures:
            return architectures[0]
    raise FileNotFoundError(
        f"model.path={model_path!s} has neither model_index.json (diffusers) nor a config.json with "
        "'architectures': point it at a model checkpoint directory"
    )


@functools.lru_cache(maxsize=64)
def get_model_adapter(model_path: str | Path) -> type[ModelAdapter]:
    """The adapter registered for the checkpoint at ``model_path`` (whether it serves the run's algorithm is
    checked by the config validation, ``verl_omni.algorithms.check_model_supports``).

    Cached: the agent loop builds one loop per sample and each asks for its adapter (a config read)."""
    try:
        adapter = MODEL_ADAPTERS.get(architecture_name(model_path))
    except ValueError as e:
        raise ValueError(f"model.path={model_path!s}: {e}") from None
    return adapter.for_checkpoint(model_path)

"""What the diffusers-based flow-matching adapters (SD3.5, FLUX.1, Z-Image) share.

One recorded latent layout for all of them: packed 2×2 latent tokens ``[B, S, 4C]`` (what FLUX
and Qwen-Image denoise in; SD3 and Z-Image denoise ``[B, C, h, w]`` and their rollout records
:func:`pack_latents` of it). The SDE step and its log-prob are elementwise with a mean over all
non-batch dims, so packing changes neither; it keeps ``all_latents`` ``[B, W+1, S, C]`` for every
model and ``S`` the transformer's image token count (the schedule's ``image_seq_len``).

:class:`DiffusersFlowMatchAdapter` holds the model-neutral facts and methods: loading the
transformer class named by the adapter, the scheduler, the VAE scale, the sigma schedule as
diffusers' pipelines set it (static or resolution-dependent shift), and the size multiple.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

import torch

from verl_omni.pipelines.model_base import ODE_SAMPLES, SDE_WINDOW, ModelAdapter

# the attention projections of both streams of a joint-attention (MMDiT) block, diffusers' names: Flow-GRPO's LoRA
# targets for SD3.5, also FLUX.1's double-stream blocks (its single-stream blocks share to_q/k/v)
JOINT_ATTENTION_LORA_TARGETS = (
    "to_q",
    "to_k",
    "to_v",
    "to_out.0",
    "add_q_proj",
    "add_k_proj",
    "add_v_proj",
    "to_add_out",
)


def pack_latents(latents: torch.Tensor) -> torch.Tensor:
    """``[B, C, h, w]`` → ``[B, (h/2)(w/2), 4C]``, 2×2 patches in FLUX's order (``FluxPipeline._pack_latents``)."""
    b, c, h, w = latents.shape
    x = latents.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // 2) * (w // 2), c * 4)


def unpack_latents(tokens: torch.Tensor, latent_height: int, latent_width: int) -> torch.Tensor:
    """Inverse of :func:`pack_latents`: ``[B, S, 4C]`` → ``[B, C, h, w]``."""
    b, _, c4 = tokens.shape
    x = tokens.view(b, latent_height // 2, latent_width // 2, c4 // 4, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(b, c4 // 4, latent_height, latent_width)


def source_grid_groups(grid: torch.Tensor) -> list[tuple[torch.Tensor, tuple[tuple[int, int], ...]]]:
    """An editing batch's samples grouped by their source images' grids: ``(row indices, grid)`` per group.

    ``grid`` is the recorded ``image_latents_grid`` ``[B, K, 2]`` (each source image's packed rows, columns;
    all-zero rows pad a sample with fewer images). Samples of one group have the same source-token layout and
    are predicted in one transformer call."""
    grids = [tuple((int(r), int(c)) for r, c in g if r * c > 0) for g in grid.tolist()]
    return [
        (torch.tensor([i for i, g in enumerate(grids) if g == key], device=grid.device), key)
        for key in dict.fromkeys(grids)
    ]


def with_source_tokens(
    tokens: torch.Tensor, image_latents: torch.Tensor, rows: torch.Tensor, grid: tuple[tuple[int, int], ...]
) -> torch.Tensor:
    """``tokens[rows]`` ``[b, S, C]`` followed by those samples' source-image tokens (the first rows·cols of each
    image in ``grid``, from the right-padded ``image_latents`` ``[B, S_c, C]``): the editing models' sequence."""
    count = sum(r * c for r, c in grid)
    return torch.cat([tokens[rows], image_latents[rows, :count].to(tokens.dtype)], dim=1)


def calculate_shift(image_seq_len: int, config, default_max_shift: float = 1.15) -> float:
    """μ of the resolution-dependent shift, linear in the image token count (diffusers' ``calculate_shift``)."""
    base_len, max_len = config.get("base_image_seq_len", 256), config.get("max_image_seq_len", 4096)
    base_shift, max_shift = config.get("base_shift", 0.5), config.get("max_shift", default_max_shift)
    slope = (max_shift - base_shift) / (max_len - base_len)
    return image_seq_len * slope + (base_shift - slope * base_len)


def classic_cfg(v_pos: torch.Tensor, v_neg: torch.Tensor, scale: float) -> torch.Tensor:
    """Classic CFG as SD3's pipelines compute it: v_neg + w·(v_pos − v_neg)."""
    return v_neg + scale * (v_pos - v_neg)


class DiffusersFlowMatchAdapter(ModelAdapter):
    """Base of the adapters whose training module is a diffusers transformer in ``transformer/``.

    Class attributes (on top of :class:`ModelAdapter`'s):
        transformer_class (`str`): the diffusers class of ``transformer/``.
        patch_size (`int`): latent cells per transformer patch side (2×2 latent tokens); the released
            checkpoints' 8× VAE makes ``latent_multiple`` 16 pixels.
        default_max_shift (`float`): ``max_shift`` when the scheduler config lacks it (the pipeline's default).
        linear_sigmas (`bool`): the pipeline passes ``sigmas = linspace(1, 1/N, N)`` to the scheduler
            (FLUX) instead of letting it space the timesteps.
        zero_sigma_min (`bool`): the pipeline sets ``scheduler.sigma_min = 0`` first (Z-Image): its last
            step runs σ = 0 → 0, a step no SDE window may include (:meth:`max_sde_window_end`).
    """

    transformer_class: ClassVar[str]
    # the shared recorder (diffusers_rollout): an SDE window, or (noise level 0) an ODE sample's clean latents
    rollout_records: ClassVar[tuple[str, ...]] = (SDE_WINDOW, ODE_SAMPLES)
    transformer_subfolder: ClassVar[str] = "transformer"
    patch_size: ClassVar[int] = 2
    # 8x VAE x 2x2 latent patches (SD3.5, FLUX.1 and Z-Image alike)
    latent_multiple = 16
    default_max_shift: ClassVar[float] = 1.15
    linear_sigmas: ClassVar[bool] = False
    zero_sigma_min: ClassVar[bool] = False

    @classmethod
    def build_module(cls, model_path: str | Path, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
        import diffusers

        path = Path(model_path) / cls.transformer_subfolder
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"model.path={model_path!s} has no {cls.transformer_subfolder}/config.json: point it at a diffusers "
                f"{cls.transformer_class} checkpoint directory (see `python -m verl_omni.utils.tiny_models`)"
            )
        return getattr(diffusers, cls.transformer_class).from_pretrained(path, torch_dtype=dtype)

    @classmethod
    def build_scheduler(cls, model_path: str | Path):
        from verl_omni.pipelines.schedulers import FlowMatchSDEDiscreteScheduler

        return FlowMatchSDEDiscreteScheduler.from_pretrained(model_path, subfolder="scheduler")

    @staticmethod
    def vae_scale_factor(model_path: str | Path) -> int:
        """Pixels per latent cell of the 2-D ``AutoencoderKL``, as these pipelines derive it."""
        config = json.loads((Path(model_path) / "vae" / "config.json").read_text())
        return 2 ** (len(config["block_out_channels"]) - 1)

    @classmethod
    def prompt_token_ids(cls, tokenizer, prompt: str) -> list[int]:
        """Ids of ``prompt`` from the adapter's tokenizer (CLIP for SD3.5 and FLUX.1), no padding, truncated to
        the encoder's length as the pipelines do; the rollout decodes them back to the text its encoders read."""
        return list(tokenizer(prompt, truncation=True, max_length=tokenizer.model_max_length).input_ids)

    @classmethod
    def max_sde_window_end(cls, num_inference_steps: int) -> int:
        """One past the last step an SDE window may cover (``sde_window_range[1]`` at most)."""
        return num_inference_steps - 1 if cls.zero_sigma_min else num_inference_steps

    @classmethod
    def set_schedule(cls, scheduler, spec, image_seq_len: int) -> None:
        """The rollout's schedule, set as the model's diffusers pipeline sets it; ``image_seq_len`` is
        the packed token count ``S`` (μ of the dynamic shift, when the scheduler config asks for one)."""
        import numpy as np

        steps = spec.num_inference_steps
        kwargs = {}
        if scheduler.config.get("use_dynamic_shifting"):
            kwargs["mu"] = calculate_shift(image_seq_len, scheduler.config, cls.default_max_shift)
        if cls.zero_sigma_min:
            scheduler.sigma_min = 0.0
        if cls.linear_sigmas:
            scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), **kwargs)
        else:
            scheduler.set_timesteps(steps, **kwargs)

    @staticmethod
    def latent_grid(spec, vae_scale_factor: int) -> tuple[int, int]:
        """(h, w) of the unpacked latents of a ``spec.height × spec.width`` image."""
        return 2 * (spec.height // (2 * vae_scale_factor)), 2 * (spec.width // (2 * vae_scale_factor))

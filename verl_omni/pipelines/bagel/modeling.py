"""BAGEL's generation path as a plain PyTorch module, in the checkpoint's own parameter names.

BAGEL is a Qwen2 "mixture of transformers": every decoder layer holds two experts with the same
shapes, the understanding expert (``q_proj``, ``mlp``, ``input_layernorm`` ...) that processes
text, and the generation expert (``q_proj_moe_gen``, ``mlp_moe_gen``, ``input_layernorm_moe_gen``
...) that processes the image latent tokens. Image generation is a velocity field over packed
latent tokens that attend to a text KV cache built by the understanding expert.

The rollout runs vLLM-Omni's ``BagelPipeline``, whose layers are tensor-parallel and fused
(``qkv_proj`` + ``gen_exp``, ``gate_up_proj``) and cannot be trained with FSDP/peft. This module
is the training side: ``nn.Linear`` layers named exactly as in ``ema.safetensors``, so it loads
the checkpoint the rollout loads, peft can put LoRA on the generation expert, and its names map
back onto the rollout's fused layers through vLLM-Omni's own loader (``BagelPipeline.load_weights``).
Its arithmetic follows the rollout's, including where the rollout casts activations to bf16.

Only what text-to-image needs is built: token embeddings, both experts, the final norms, the
timestep embedder, ``vae2llm`` / ``llm2vae`` and the latent position table. The ViT, connector
and LM head are not loaded (they serve understanding and image inputs).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from diffusers.loaders.peft import PeftAdapterMixin
from torch import nn
from torch.utils.checkpoint import checkpoint

# the rollout (vLLM-Omni) computes attention and the expert MLPs of the generation path in bf16
ROLLOUT_ACTIVATION_DTYPE = torch.bfloat16
TIMESTEP_FREQUENCIES = 256


@dataclass(frozen=True)
class BagelConfig:
    """The numbers the generation path needs, read from ``config.json`` and ``llm_config.json``.

    Args:
        hidden_size (int), intermediate_size (int), num_hidden_layers (int), num_attention_heads (int),
        num_key_value_heads (int), vocab_size (int), rms_norm_eps (float), rope_theta (float): the LLM.
        latent_channels (int): VAE ``z_channels`` (16 for BAGEL's FLUX VAE).
        vae_downsample (int): VAE spatial downsampling (8).
        latent_patch_size (int): latent cells per side packed into one token (2).
        max_latent_size (int): side of the latent position table (tokens per image side).
    """

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    latent_channels: int = 16
    vae_downsample: int = 8
    latent_patch_size: int = 2
    max_latent_size: int = 32

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def patch_latent_dim(self) -> int:
        return self.latent_patch_size**2 * self.latent_channels

    @property
    def latent_downsample(self) -> int:
        """Pixels per latent token side."""
        return self.vae_downsample * self.latent_patch_size

    @classmethod
    def from_pretrained(cls, model_path: str | Path) -> BagelConfig:
        root = Path(model_path)
        for name in ("config.json", "llm_config.json"):
            if not (root / name).is_file():
                raise FileNotFoundError(f"model.path={root} has no {name}: point it at a BAGEL checkpoint directory")
        top = json.loads((root / "config.json").read_text())
        llm = json.loads((root / "llm_config.json").read_text())
        vae = top.get("vae_config") or {}
        return cls(
            hidden_size=llm["hidden_size"],
            intermediate_size=llm["intermediate_size"],
            num_hidden_layers=llm["num_hidden_layers"],
            num_attention_heads=llm["num_attention_heads"],
            num_key_value_heads=llm.get("num_key_value_heads", llm["num_attention_heads"]),
            vocab_size=llm["vocab_size"],
            rms_norm_eps=llm.get("rms_norm_eps", 1e-6),
            rope_theta=llm.get("rope_theta", 10000.0),
            latent_channels=int(vae.get("z_channels", 16)),
            vae_downsample=int(vae.get("downsample", 8)),
            latent_patch_size=int(top.get("latent_patch_size", 2)),
            max_latent_size=int(top.get("max_latent_size", 32)),
        )


def image_marker_token_ids(model_path: str | Path) -> tuple[int, int]:
    """Ids of ``<|vision_start|>`` / ``<|vision_end|>`` in the checkpoint's tokenizer (they frame the image)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_path), local_files_only=True)
    ids = tokenizer.convert_tokens_to_ids(["<|vision_start|>", "<|vision_end|>"])
    if any(i is None or i == tokenizer.unk_token_id for i in ids):
        raise ValueError(
            f"the tokenizer of {model_path} lacks <|vision_start|>/<|vision_end|>: not a BAGEL checkpoint?"
        )
    return tuple(ids)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in fp32, result in the input's dtype."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (xf * weight.float()).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX-style rotary embedding of ``x`` ``[T, H, D]`` with ``cos``/``sin`` ``[T, D/2]`` (fp32)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    cos, sin = cos[:, None, :], sin[:, None, :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos``, ``sin`` ``[T, D/2]`` of integer ``positions`` ``[T]``."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None]
    return freqs.cos(), freqs.sin()


def timestep_features(t: torch.Tensor, dim: int = TIMESTEP_FREQUENCIES, max_period: float = 10000.0) -> torch.Tensor:
    """Sinusoidal features ``[N, dim]`` (cos then sin) of timesteps ``t`` ``[N]`` (BAGEL passes σ in [0, 1])."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t[:, None].float() * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class Expert(nn.Module):
    """SwiGLU MLP (``gate_proj``, ``up_proj``, ``down_proj``); BAGEL's ``mlp`` and ``mlp_moe_gen``."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Attention(nn.Module):
    """Both experts' attention projections and q/k norms, as named in the checkpoint."""

    def __init__(self, config: BagelConfig):
        super().__init__()
        hidden, head_dim = config.hidden_size, config.head_dim
        q_out, kv_out = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
        for suffix in ("", "_moe_gen"):
            setattr(self, f"q_proj{suffix}", nn.Linear(hidden, q_out, bias=True))
            setattr(self, f"k_proj{suffix}", nn.Linear(hidden, kv_out, bias=True))
            setattr(self, f"v_proj{suffix}", nn.Linear(hidden, kv_out, bias=True))
            setattr(self, f"o_proj{suffix}", nn.Linear(q_out, hidden, bias=False))
            setattr(self, f"q_norm{suffix}", RMSNorm(head_dim, config.rms_norm_eps))
            setattr(self, f"k_norm{suffix}", RMSNorm(head_dim, config.rms_norm_eps))
        self.config = config

    def project(self, x: torch.Tensor, gen: bool, cos, sin) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k (normed, rotated) and v ``[T, H, D]`` of tokens ``x`` through one expert."""
        s = "_moe_gen" if gen else ""
        c = self.config
        q = getattr(self, f"q_proj{s}")(x).view(-1, c.num_attention_heads, c.head_dim)
        k = getattr(self, f"k_proj{s}")(x).view(-1, c.num_key_value_heads, c.head_dim)
        v = getattr(self, f"v_proj{s}")(x).view(-1, c.num_key_value_heads, c.head_dim)
        q = rotate(getattr(self, f"q_norm{s}")(q.float()), cos, sin)
        k = rotate(getattr(self, f"k_norm{s}")(k.float()), cos, sin)
        return q, k, v


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """SDPA over ``[T, H, D]`` queries and ``[S, Hkv, D]`` keys/values (GQA), output ``[T, H·D]``."""
    heads, kv_heads = q.shape[1], k.shape[1]
    if kv_heads != heads:
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        v = v.repeat_interleave(heads // kv_heads, dim=1)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], is_causal=causal
    )
    return out[0].transpose(0, 1).reshape(q.shape[0], -1)


class MoTDecoderLayer(nn.Module):
    """One decoder layer with both experts. ``forward`` dispatches on ``mode`` ("und" prefill or "gen"), so
    FSDP's per-layer unshard hooks (which run around ``forward``) cover both passes."""

    def __init__(self, config: BagelConfig):
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = Expert(config.hidden_size, config.intermediate_size)
        self.mlp_moe_gen = Expert(config.hidden_size, config.intermediate_size)
        for name in ("input_layernorm", "post_attention_layernorm"):
            setattr(self, name, RMSNorm(config.hidden_size, config.rms_norm_eps))
            setattr(self, f"{name}_moe_gen", RMSNorm(config.hidden_size, config.rms_norm_eps))

    def forward(self, mode: str, *args):
        return self.prefill(*args) if mode == "und" else self.generate(*args)

    def prefill(self, x: torch.Tensor, cos, sin) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Understanding expert, causal, over text tokens ``[T, hidden]``; returns output and the layer's (k, v)."""
        attn = self.self_attn
        q, k, v = attn.project(self.input_layernorm(x), False, cos, sin)
        act = ROLLOUT_ACTIVATION_DTYPE
        k, v = k.to(act), v.to(act)
        h = x + attn.o_proj(attend(q.to(act), k, v, causal=True).to(x.dtype))
        return h + self.mlp(self.post_attention_layernorm(h)), (k, v)

    def generate(self, text: torch.Tensor, latent: torch.Tensor, cache, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer of the generation pass: image-marker ``text`` tokens (und expert) and ``latent`` tokens (gen
        expert) attend, non-causally, to the cache and to each other."""
        attn, act = self.self_attn, ROLLOUT_ACTIVATION_DTYPE
        tq, tk, tv = attn.project(self.input_layernorm(text).to(act).to(text.dtype), False, cos[:1], sin[:1])
        lq, lk, lv = attn.project(self.input_layernorm_moe_gen(latent).to(act).to(latent.dtype), True, cos, sin)
        # (FSDP casts a layer's floating inputs to its parameter dtype: the bf16 cache may arrive as fp32)
        keys = torch.cat([t.to(act) for t in (cache[0], tk, lk) if t is not None])
        values = torch.cat([t.to(act) for t in (cache[1], tv, lv) if t is not None])
        out = attend(torch.cat([tq, lq]).to(act), keys, values, causal=False)
        n_text = text.shape[0]
        text = text + attn.o_proj(out[:n_text].to(text.dtype)).to(text.dtype)
        latent = latent + attn.o_proj_moe_gen(out[n_text:].to(latent.dtype)).to(latent.dtype)
        text_in = self.post_attention_layernorm(text).to(act).to(text.dtype)
        latent_in = self.post_attention_layernorm_moe_gen(latent).to(act).to(latent.dtype)
        return text + self.mlp(text_in), latent + self.mlp_moe_gen(latent_in)


class Qwen2MoTModel(nn.Module):
    def __init__(self, config: BagelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([MoTDecoderLayer(config) for _ in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.norm_moe_gen = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LanguageModel(nn.Module):
    """``language_model.*`` of the checkpoint (the LM head is not part of the generation path)."""

    def __init__(self, config: BagelConfig):
        super().__init__()
        self.model = Qwen2MoTModel(config)


class TimestepEmbedder(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(TIMESTEP_FREQUENCIES, hidden), nn.SiLU(), nn.Linear(hidden, hidden))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.mlp(timestep_features(t).to(self.mlp[0].weight.dtype))


class LatentPositions(nn.Module):
    """``latent_pos_embed.pos_embed``: a fixed 2-D sin-cos table over ``max_latent_size²`` cells (loaded, not trained)."""

    def __init__(self, config: BagelConfig):
        super().__init__()
        self.pos_embed = nn.Parameter(torch.zeros(config.max_latent_size**2, config.hidden_size), requires_grad=False)


@dataclass(frozen=True)
class Guidance:
    """BAGEL's classifier-free guidance: text CFG, image CFG and renormalization, inside a σ interval.

    Args:
        text_scale (float): text-CFG scale (<= 1: off).
        image_scale (float): image-CFG scale (<= 1: off); in text-to-image the image-free branch is the
            conditional one.
        interval (tuple[float, float]): CFG applies when ``interval[0] < σ <= interval[1]``.
        renorm_type (str): ``"global"``, ``"channel"`` or ``"text_channel"``.
        renorm_min (float): lower clamp of the renormalization factor.
    """

    text_scale: float = 4.0
    image_scale: float = 1.0
    interval: tuple[float, float] = (0.4, 1.0)
    renorm_type: str = "global"
    renorm_min: float = 0.0

    def __post_init__(self):
        if self.renorm_type not in ("global", "channel", "text_channel"):
            raise ValueError(f"cfg_renorm_type must be global, channel or text_channel, got {self.renorm_type!r}")

    def active(self, sigma: float) -> bool:
        return self.text_scale > 1.0 and self.interval[0] < sigma <= self.interval[1]

    def combine(self, v: torch.Tensor, v_text: torch.Tensor) -> torch.Tensor:
        """Guided velocity from the conditional ``v`` and the text-unconditional ``v_text`` ``[S, C]``."""
        v_img = v  # text-to-image: the image-unconditional branch is the conditional one
        guided_text = v_text + self.text_scale * (v - v_text)
        if self.renorm_type == "text_channel":
            scale = v.norm(dim=-1, keepdim=True) / (guided_text.norm(dim=-1, keepdim=True) + 1e-8)
            guided_text = guided_text * scale.clamp(min=self.renorm_min, max=1.0)
            return v_img + self.image_scale * (guided_text - v_img) if self.image_scale > 1.0 else guided_text
        guided = v_img + self.image_scale * (guided_text - v_img) if self.image_scale > 1.0 else guided_text
        if self.renorm_type == "global":
            scale = v.norm() / (guided.norm() + 1e-8)
        else:
            scale = v.norm(dim=-1, keepdim=True) / (guided.norm(dim=-1, keepdim=True) + 1e-8)
        return guided * scale.clamp(min=self.renorm_min, max=1.0)


@dataclass
class TextContext:
    """The KV cache of a prefilled text context: per layer ``(k, v)`` ``[L, Hkv, D]`` (None when empty), and
    the rotary position the image block takes (the context length)."""

    layers: list[tuple[torch.Tensor | None, torch.Tensor | None]]
    rope: int


class BagelForGeneration(nn.Module, PeftAdapterMixin):
    """BAGEL's generation path (see module docstring); parameter names match ``ema.safetensors``.

    LoRA goes in through diffusers' ``PeftAdapterMixin`` (``add_adapter``, ``disable_adapters``...),
    as for the diffusers transformers the engine trains.
    """

    # checkpoint keys of the understanding-only parts this module does not build
    IGNORED_PREFIXES = ("vit_model.", "connector.", "vit_pos_embed.", "language_model.lm_head.")

    def __init__(self, config: BagelConfig, marker_token_ids: tuple[int, int] = (0, 0)):
        super().__init__()
        self.config = config
        # start-of-image / end-of-image token ids that frame the latent tokens
        self.marker_token_ids = tuple(marker_token_ids)
        self.gradient_checkpointing = False
        self.language_model = LanguageModel(config)
        self.time_embedder = TimestepEmbedder(config.hidden_size)
        self.vae2llm = nn.Linear(config.patch_latent_dim, config.hidden_size)
        self.llm2vae = nn.Linear(config.hidden_size, config.patch_latent_dim)
        self.latent_pos_embed = LatentPositions(config)

    @property
    def layers(self) -> nn.ModuleList:
        return self.language_model.model.layers

    def enable_gradient_checkpointing(self) -> None:
        """Recompute each generation-pass layer in backward instead of keeping its activations."""
        self.gradient_checkpointing = True

    def image_marker_ids(self, device) -> torch.Tensor:
        return torch.tensor(self.marker_token_ids, dtype=torch.long, device=device)

    @classmethod
    def from_pretrained(cls, model_path: str | Path, dtype: torch.dtype = torch.float32) -> BagelForGeneration:
        """Build from ``config.json`` / ``llm_config.json`` and load ``ema.safetensors``; every built tensor must load."""
        from safetensors.torch import load_file

        weights_file = Path(model_path) / "ema.safetensors"
        if not weights_file.is_file():
            raise FileNotFoundError(f"model.path={model_path!s} has no ema.safetensors (BAGEL's weight file)")
        model = cls(BagelConfig.from_pretrained(model_path), image_marker_token_ids(model_path))
        state = {k: v for k, v in load_file(str(weights_file)).items() if not k.startswith(cls.IGNORED_PREFIXES)}
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(
                f"{weights_file} does not match the BAGEL generation module: missing {missing[:6]}, "
                f"unexpected {unexpected[:6]}"
            )
        return model.to(dtype)

    # ---- text context (understanding expert, frozen) ------------------------------------------

    def prefill(self, token_ids: torch.Tensor) -> TextContext:
        """KV cache of ``token_ids`` ``[L]`` (may be empty: the unconditional context) at positions 0..L-1."""
        n_layers = len(self.layers)
        if token_ids.numel() == 0:
            return TextContext([(None, None)] * n_layers, rope=0)
        c = self.config
        positions = torch.arange(token_ids.numel(), device=token_ids.device)
        cos, sin = rope_tables(positions, c.head_dim, c.rope_theta)
        h = self.language_model.model.embed_tokens(token_ids)
        caches = []
        for layer in self.layers:
            h, kv = layer("und", h, cos, sin)
            caches.append(kv)
        return TextContext(caches, rope=int(token_ids.numel()))

    # ---- velocity (generation expert) -----------------------------------------------------------

    def latent_position_ids(self, height: int, width: int, device) -> torch.Tensor:
        """Row-major cell ids of an ``height``×``width`` image in the ``max_latent_size``² position table."""
        d, side = self.config.latent_downsample, self.config.max_latent_size
        rows, cols = torch.arange(height // d, device=device), torch.arange(width // d, device=device)
        return (rows[:, None] * side + cols[None]).flatten()

    def velocity(
        self,
        latents: torch.Tensor,
        sigma: torch.Tensor,
        context: TextContext,
        marker_ids: torch.Tensor,
        position_ids: torch.Tensor,
    ) -> torch.Tensor:
        """Velocity ``[S, C]`` of one image's packed latent tokens ``latents`` ``[S, C]`` at σ (scalar tensor).

        ``marker_ids`` are the start/end-of-image token ids framing the latent tokens; the whole
        image block sits at rotary position ``context.rope``.
        """
        c = self.config
        model = self.language_model.model
        text = model.embed_tokens(marker_ids)
        pos = self.latent_pos_embed.pos_embed[position_ids]
        t_emb = self.time_embedder(sigma.reshape(1).expand(latents.shape[0]).to(latents.device))
        latent = self.vae2llm(latents.to(self.vae2llm.weight.dtype)) + t_emb + pos.to(t_emb.dtype)
        rope = torch.full((latents.shape[0],), context.rope, device=latents.device)
        cos, sin = rope_tables(rope, c.head_dim, c.rope_theta)
        for layer, cache in zip(self.layers, context.layers, strict=True):
            if self.gradient_checkpointing and torch.is_grad_enabled():
                text, latent = checkpoint(layer, "gen", text, latent, cache, cos, sin, use_reentrant=False)
            else:
                text, latent = layer("gen", text, latent, cache, cos, sin)
        return self.llm2vae(rms_norm(latent, model.norm_moe_gen.weight, c.rms_norm_eps))

    # ---- the policy: CFG-guided velocity of a batch (the module's forward) -------------------------

    def forward(
        self,
        latents: torch.Tensor,
        sigmas: torch.Tensor,
        prompt_token_ids: list[torch.Tensor],
        negative_prompt_token_ids: list[torch.Tensor] | None,
        height: int,
        width: int,
        guidance: Guidance,
    ) -> torch.Tensor:
        """Guided velocity ``[B, S, C]`` of ``latents`` ``[B, S, C]`` at ``sigmas`` ``[B]``, one sample at a time.

        Each sample's context is its prompt, prefilled by the frozen understanding expert; the text-CFG
        branch uses its negative prompt (empty when None, as BAGEL does); the image-CFG branch of
        text-to-image has no image, so it is the conditional branch itself.
        """
        position_ids = self.latent_position_ids(height, width, latents.device)
        if position_ids.numel() != latents.shape[1]:
            raise ValueError(
                f"{height}x{width} has {position_ids.numel()} latent tokens, latents have {latents.shape[1]}"
            )
        outputs = []
        for i in range(latents.shape[0]):
            sigma = sigmas[i]
            with torch.no_grad():
                context = self.prefill(prompt_token_ids[i])
            v = self.velocity(latents[i], sigma, context, self.image_marker_ids(latents.device), position_ids)
            if guidance.active(float(sigma)):
                negative = negative_prompt_token_ids[i] if negative_prompt_token_ids is not None else None
                with torch.no_grad():
                    uncond = self.prefill(negative if negative is not None else prompt_token_ids[i][:0])
                v_text = self.velocity(latents[i], sigma, uncond, self.image_marker_ids(latents.device), position_ids)
                v = guidance.combine(v, v_text)
            outputs.append(v)
        return torch.stack(outputs)

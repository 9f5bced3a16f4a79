"""Config of the trained diffusion model and its LoRA (the ``actor_rollout_ref.model`` node).

It stands where verl's ``HFModelConfig`` stands for a language model; ``HFModelConfig`` cannot
be used because it loads a transformers ``AutoConfig`` and a tokenizer from ``path``, which a
diffusers pipeline directory does not have at its root. The field names verl's ``FSDPEngine``
reads (``use_remove_padding``, ``lora_rank``, ``lora.merge``, gradient checkpointing, activation
offload) keep their verl meaning.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from verl.base_config import BaseConfig

LORA_INITS = (True, False, "gaussian")


@dataclass
class DiffusionLoraConfig(BaseConfig):
    """LoRA on the diffusion transformer (``model.lora``).

    Args:
        rank (int): LoRA rank r; 0 is full fine-tuning: every transformer parameter trains, sharded with its
            gradients and optimizer state over the actor ranks, and the rollout gets full weights in checked
            buckets (``docs/guide/training.md``, "Full fine-tuning"); a KL term (``actor.kl_beta > 0``) then keeps
            a frozen copy of the base transformer as the reference.
        alpha (int): LoRA alpha; the update is scaled by alpha / r.
        target_modules (list[str] | None): module names to adapt; None takes the adapter's
            ``lora_target_modules`` (the architecture's usual choice).
        init_lora_weights (bool | str): peft init; True (B = 0, the policy starts as the base model),
            ``"gaussian"``, or False (random B, for tests only).
        dropout (float): LoRA dropout; Flow-GRPO uses 0 so that replay is deterministic.
        merge (bool): (verl's ``lora.merge``) send the rollout the adapted linears' weights with the LoRA merged in
            (``W + alpha / r * B @ A``, rounded once to the rollout's dtype) instead of the adapter: the rollout runs
            plain linears, faster than serving the adapter, whose low-rank products are separate memory-bound
            kernels beside every adapted linear (``docs/perf.md`` has the figure).
            Its log-probs then carry the merge's rounding too (logged each step, ``old_log_prob/rollout_diff_max``).
            Needs rank > 0 and a model with a full-weight sync. Default False. docs/guide/training.md, "Weight sync to
            the rollout".
    """

    rank: int = 32
    alpha: int = 64
    target_modules: list[str] | None = None
    init_lora_weights: Any = True
    dropout: float = 0.0
    merge: bool = False

    def __post_init__(self):
        if self.rank < 0:
            raise ValueError(f"model.lora.rank must be >= 0, got {self.rank}")
        if self.rank > 0 and self.alpha <= 0:
            raise ValueError(f"model.lora.alpha must be > 0, got {self.alpha}")
        if self.init_lora_weights not in LORA_INITS:
            raise ValueError(
                f"model.lora.init_lora_weights must be one of {LORA_INITS}, got {self.init_lora_weights!r}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.lora.dropout must be in [0, 1), got {self.dropout}")
        if self.merge and self.rank == 0:
            raise ValueError(
                "model.lora.merge=true merges a LoRA into the rollout's weights, but model.lora.rank=0 trains the "
                "full transformer (synced whole already): set model.lora.merge=false"
            )


@dataclass
class DiffusionModelConfig(BaseConfig):
    """The diffusion model to train (``actor_rollout_ref.model``).

    Args:
        path (str): local checkpoint directory: a diffusers pipeline (``model_index.json`` at its root) or a
            non-diffusers model whose ``config.json`` names its architecture (BAGEL).
        model_type (str): engine registry key; ``"diffusion_model"`` selects ``DiffusersFSDPEngine``.
        lora (DiffusionLoraConfig): LoRA settings.
        enable_gradient_checkpointing (bool): recompute each transformer block in backward.
        gradient_checkpointing_fraction (float): with ``enable_gradient_checkpointing``, the share of the transformer's
            blocks recomputed in backward, spread evenly (1.0: all); the others keep their activations from the
            forward, which saves their recompute and costs their activation memory. In (0, 1]: no checkpointing at all
            is ``enable_gradient_checkpointing=false``. Below 1 it needs a diffusers transformer (its
            ``enable_gradient_checkpointing`` takes a checkpointing function; the engine refuses other models).
        enable_activation_offload (bool): offload checkpointed activations to host (verl's helper).
        compile_transformer_blocks (bool): ``torch.compile`` the forward of each FSDP-wrapped transformer block of
            the trained module (regional compilation: one graph reused by every block, the FSDP hooks and the
            gradient checkpointing around it left eager). Fuses the elementwise kernels between the GEMMs
            (modulation, norms, RoPE, gates, the LoRA's scale and add); the first step pays the compile. Off by
            default (CPU runs and tests would pay the compile for nothing); ``docs/perf.md`` has its measured effect
            on the replay.
        compile_dynamic (bool): with ``compile_transformer_blocks``, how the blocks' sizes are compiled. false
            (default, torch's own): static graphs first; the first call with another text length or micro-batch
            compiles once more and makes that size symbolic, so one step early in a run (the first whose prompts
            differ in length from those before) pays a second compile, and ``perf/actor_compiled_graphs`` shows
            it. true: every size symbolic from the first compile, so no later step compiles, but the kernels are
            generic in all sizes and the replay is slower (``docs/perf.md``).
        use_remove_padding (bool): always False: images have no padding to remove (read by verl).
    """

    # verl's TrainingWorker writes the model type it was built for into the model config
    _mutable_fields = BaseConfig._mutable_fields | {"model_type"}

    path: str = ""
    model_type: str = "diffusion_model"
    lora: DiffusionLoraConfig = field(default_factory=DiffusionLoraConfig)
    enable_gradient_checkpointing: bool = True
    gradient_checkpointing_fraction: float = 1.0
    enable_activation_offload: bool = False
    compile_transformer_blocks: bool = False
    compile_dynamic: bool = False
    use_remove_padding: bool = False

    def __post_init__(self):
        from verl_omni.pipelines.model_base import architecture_name

        if not self.path:
            raise ValueError("model.path is required: a model checkpoint directory (diffusers pipeline or BAGEL)")
        try:
            architecture_name(self.path)
        except FileNotFoundError as error:
            raise ValueError(str(error)) from error
        if self.use_remove_padding:
            raise ValueError("model.use_remove_padding must be False for diffusion models")
        fraction = self.gradient_checkpointing_fraction
        if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 < fraction <= 1:
            raise ValueError(
                f"model.gradient_checkpointing_fraction must be a number in (0, 1], got {fraction!r}; for no "
                "checkpointing at all set model.enable_gradient_checkpointing=false"
            )
        if fraction < 1 and not self.enable_gradient_checkpointing:
            raise ValueError(
                f"model.gradient_checkpointing_fraction={fraction} is the share of blocks recomputed when "
                "model.enable_gradient_checkpointing=true, which is false here: set it true, or leave the fraction 1.0"
            )
        if not isinstance(self.compile_dynamic, bool):
            raise ValueError(f"model.compile_dynamic must be true or false, got {self.compile_dynamic!r}")
        if isinstance(self.lora, dict):
            raise TypeError("model.lora must be a DiffusionLoraConfig (convert YAML with omega_conf_to_dataclass)")

    @property
    def lora_rank(self) -> int:
        """verl's name for the LoRA rank (``FSDPEngine`` reads it)."""
        return self.lora.rank

    @property
    def adapter(self):
        """The checkpoint's model adapter (:func:`~verl_omni.pipelines.model_base.get_model_adapter`)."""
        from verl_omni.pipelines.model_base import get_model_adapter

        return get_model_adapter(self.path)

    @cached_property
    def tokenizer(self):
        """The prompt tokenizer (the adapter's ``tokenizer_subfolder`` of ``path``), what the agent loop uses."""
        from transformers import AutoTokenizer

        tokenizer_dir = Path(self.path) / self.adapter.tokenizer_subfolder
        if not (tokenizer_dir / "tokenizer_config.json").is_file():
            raise ValueError(
                f"model.path={self.path} has no tokenizer in {tokenizer_dir}: the agent loop needs the text tokenizer"
            )
        return AutoTokenizer.from_pretrained(str(tokenizer_dir))

    @property
    def processor(self):
        """No multimodal processor: prompts are text (verl's agent loop reads this attribute)."""
        return None

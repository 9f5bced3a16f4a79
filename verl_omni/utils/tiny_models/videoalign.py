"""Tiny random VideoReward checkpoint in the released layout (``videoalign`` scorer).

VideoReward (KwaiVGI/VideoReward on the Hugging Face Hub) is published as a training output directory:

- ``model_config.json``: the run's settings in four sections, ``data_config`` (frame sampling and sizing, the prompt
  template), ``model_config`` (base model, three special reward tokens, a 1-wide head), ``peft_lora_config`` (LoRA
  rank and alpha on the language model's linear layers) and ``inference_config`` (the mean and standard deviation
  that normalize each of VQ, MQ, TA);
- ``checkpoint-<step>/model.pth``: the whole state dict of the PEFT-wrapped reward model (a
  ``Qwen2VLForConditionalGeneration`` of transformers 4.45 plus ``rm_head``), as ``torch.save`` writes it: names under
  ``base_model.model.`` (``visual.*``, ``model.*``, ``lm_head.*``, ``rm_head.weight``), each adapted linear layer as
  ``<name>.base_layer.{weight,bias}`` with ``<name>.lora_A.default.weight`` and ``<name>.lora_B.default.weight``.

The base model's config and processor files (Qwen2-VL-2B-Instruct) are written to the same directory, as the
``hpsv3`` tiny builder writes them (a 2-layer Qwen2-VL, a tokenizer trained offline); the token embedding counts the
three added tokens. LoRA runs at a tiny rank with the published alpha/rank ratio; the normalization statistics are the
published ones. Tensors are drawn from the seed by name and shape (:mod:`.seeded`), LoRA's B included (a trained
adapter is non-zero), so the bytes do not depend on the transformers or peft version.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

logger = logging.getLogger(__name__)

CHECKPOINT_STEP = 11352
SPECIAL_TOKENS = ("<|VQ_reward|>", "<|MQ_reward|>", "<|TA_reward|>")
LORA_RANK = 4
LORA_ALPHA = 8  # alpha / rank = 2, as published (128 / 64)
# the language model's linear layers (LoRA targets: every nn.Linear outside visual, lm_head and rm_head)
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
NORMALIZATION = {
    "VQ_mean": 3.6757,
    "VQ_std": 2.2476,
    "MQ_mean": 1.1646,
    "MQ_std": 1.3811,
    "TA_mean": 2.8105,
    "TA_std": 2.5121,
}


def model_config(lora_rank: int = LORA_RANK, lora_alpha: int = LORA_ALPHA) -> dict:
    """``model_config.json`` with the released run's inference-relevant values (rank and alpha at tiny size)."""
    return {
        "data_config": {
            "meta_data": "/path/to/dataset/meta_data.csv",
            "data_dir": "/path/to/dataset",
            "meta_data_test": None,
            "max_frame_pixels": 200704,
            "num_frames": None,
            "fps": 2.0,
            "p_shuffle_frames": 0.0,
            "p_color_jitter": 0.0,
            "eval_dim": ["VQ", "MQ", "TA"],
            "prompt_template_type": "detailed_special",
            "add_noise": False,
            "sample_type": "uniform",
            "use_tied_data": True,
        },
        "model_config": {
            "model_name_or_path": "Qwen/Qwen2-VL-2B-Instruct",
            "output_dim": 1,
            "use_special_tokens": True,
            "torch_dtype": "bfloat16",
            "reward_token": "special",
            "loss_type": "btt",
        },
        "peft_lora_config": {
            "lora_enable": True,
            "vision_lora": False,
            "lora_r": lora_rank,
            "lora_alpha": lora_alpha,
            "lora_dropout": 0.05,
            "lora_namespan_exclude": ["lm_head", "rm_head", "embed_tokens", "visual"],
            "lora_task_type": "CAUSAL_LM",
            "use_rslora": False,
            "num_lora_modules": -1,
        },
        "inference_config": dict(NORMALIZATION),
    }


def peft_shapes(shapes: dict[str, tuple], rank: int) -> dict[str, tuple]:
    """Shapes of a ``Qwen2VLForConditionalGeneration`` (transformers 4.45 names) -> the PEFT-wrapped model's."""
    out = {}
    for name, shape in shapes.items():
        module, _, kind = name.rpartition(".")
        if name.startswith("model.") and module.rpartition(".")[2] in LORA_TARGETS:
            out[f"base_model.model.{module}.base_layer.{kind}"] = shape
            if kind == "weight":
                out[f"base_model.model.{module}.lora_A.default.weight"] = (rank, shape[1])
                out[f"base_model.model.{module}.lora_B.default.weight"] = (shape[0], rank)
        else:
            out[f"base_model.model.{name}"] = shape
    return out


def build_tiny_videoalign(out_dir: Path, seed: int = 0, dtype: str = "float32") -> Path:
    """Write a tiny random VideoReward directory to ``out_dir``; the same seed gives the same weights."""
    import torch
    from transformers import Qwen2VLConfig, Qwen2VLModel

    from verl_omni.utils.tiny_models.hpsv3 import TEXT_HIDDEN, published_name, write_base_model_files
    from verl_omni.utils.tiny_models.seeded import seeded_state_dict

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # the base model's files (VideoReward's code adds the three reward tokens itself)
    tokenizer, config = write_base_model_files(out_dir)
    (out_dir / "model_config.json").write_text(json.dumps(model_config(), indent=2))

    with torch.device("meta"):
        model = Qwen2VLModel(Qwen2VLConfig(**config))
    shapes = {published_name(k): tuple(v.shape) for k, v in model.state_dict().items()}
    vocab = len(tokenizer) + len(SPECIAL_TOKENS)
    shapes["model.embed_tokens.weight"] = (vocab, TEXT_HIDDEN)
    shapes["lm_head.weight"] = (vocab, TEXT_HIDDEN)
    shapes["rm_head.weight"] = (1, TEXT_HIDDEN)
    state = seeded_state_dict(peft_shapes(shapes, LORA_RANK), seed, getattr(torch, dtype))
    checkpoint_dir = out_dir / f"checkpoint-{CHECKPOINT_STEP}"
    checkpoint_dir.mkdir(exist_ok=True)
    torch.save(state, checkpoint_dir / "model.pth")
    logger.info("tiny VideoReward written to %s", out_dir)
    return out_dir

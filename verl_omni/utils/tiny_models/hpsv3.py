"""Tiny random HPSv3 checkpoint in the released file layout (``hpsv3`` scorer).

HPSv3 is published as one file, ``HPSv3.safetensors``: the whole state dict of the authors' reward model, a
``Qwen2VLForConditionalGeneration`` (names of transformers 4.45: ``visual.*``, ``model.*``, ``lm_head.*``) with the
token embedding resized for the added ``<|Reward|>`` token, plus the head ``rm_head.{0,3,5}.*`` (hidden -> 1024 ->
16 -> 2). The config and processor are those of the base model, Qwen2-VL-7B-Instruct. This directory holds both:
``config.json`` in Qwen2-VL's own layout (text keys at the top level, ``vision_config`` beside them), the processor
files (a tokenizer trained offline, Qwen2-VL's image processor settings, a chat template of the same format) and
``HPSv3.safetensors``. The head keeps the published widths (1024, 16), which the authors' code fixes. Tensors are
drawn from the seed by name and shape (:mod:`.seeded`), so the bytes do not depend on the transformers version.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

logger = logging.getLogger(__name__)

CHECKPOINT_FILE = "HPSv3.safetensors"
REWARD_TOKEN = "<|Reward|>"
HEAD_WIDTHS = (1024, 16)
TEXT_HIDDEN = 32
# the released base processor's pixel bounds (the scorer resizes every image inside them first)
PROCESSOR_MIN_PIXELS = 56 * 56
PROCESSOR_MAX_PIXELS = 28 * 28 * 16384

# Qwen2-VL's chat format for one user turn of images, videos and text, with its default system turn
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_config(tokenizer) -> dict:
    """``config.json`` of a 2-layer Qwen2-VL in the released model's layout; the vocabulary counts ``<|Reward|>``."""
    ids = tokenizer.convert_tokens_to_ids
    return {
        "architectures": ["Qwen2VLForConditionalGeneration"],
        "model_type": "qwen2_vl",
        "hidden_size": TEXT_HIDDEN,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
        "tie_word_embeddings": False,
        "vocab_size": len(tokenizer),
        "bos_token_id": ids("<|endoftext|>"),
        "eos_token_id": ids("<|im_end|>"),
        "vision_start_token_id": ids("<|vision_start|>"),
        "vision_end_token_id": ids("<|vision_end|>"),
        "vision_token_id": ids("<|vision_pad|>"),
        "image_token_id": ids("<|image_pad|>"),
        "video_token_id": ids("<|video_pad|>"),
        "torch_dtype": "float32",
        "vision_config": {
            "depth": 2,
            "embed_dim": 16,
            "hidden_size": TEXT_HIDDEN,
            "hidden_act": "quick_gelu",
            "mlp_ratio": 2,
            "num_heads": 2,
            "in_chans": 3,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
    }


def published_name(name: str) -> str:
    """A parameter name of transformers 5's ``Qwen2VLModel`` -> the released file's name (transformers 4.45)."""
    if name.startswith("language_model."):
        return "model." + name.removeprefix("language_model.")
    if name.startswith("visual."):
        return name
    raise KeyError(name)


def write_base_model_files(out_dir: Path) -> tuple[object, dict]:
    """The tiny base Qwen2-VL's files in ``out_dir`` as Qwen2-VL-7B-Instruct publishes them (preprocessor_config.json,
    the tokenizer files, chat_template.json, config.json), shared by the reward models fine-tuned from it; returns
    the tokenizer and the config written."""
    from transformers import Qwen2VLImageProcessor

    from verl_omni.utils.tiny_models.tokenizer import build_qwen2_tokenizer

    tokenizer = build_qwen2_tokenizer()
    Qwen2VLImageProcessor(min_pixels=PROCESSOR_MIN_PIXELS, max_pixels=PROCESSOR_MAX_PIXELS).save_pretrained(out_dir)
    # older transformers read the bounds from these two keys, as the released file has them
    preprocessor = json.loads((out_dir / "preprocessor_config.json").read_text())
    preprocessor.update(min_pixels=PROCESSOR_MIN_PIXELS, max_pixels=PROCESSOR_MAX_PIXELS)
    (out_dir / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2))
    tokenizer.save_pretrained(out_dir)
    (out_dir / "chat_template.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}, indent=2))
    config = tiny_config(tokenizer)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    return tokenizer, config


def build_tiny_hpsv3(out_dir: Path, seed: int = 0, dtype: str = "float32") -> Path:
    """Write a tiny random HPSv3 directory to ``out_dir``; the same seed gives the same weights."""
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen2VLConfig, Qwen2VLModel

    from verl_omni.utils.tiny_models.seeded import seeded_state_dict

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # HPSv3 adds <|Reward|> itself and resizes the embedding to match
    tokenizer, config = write_base_model_files(out_dir)

    with torch.device("meta"):
        model = Qwen2VLModel(Qwen2VLConfig(**config))
    shapes = {published_name(k): tuple(v.shape) for k, v in model.state_dict().items()}
    vocab = len(tokenizer) + 1  # + <|Reward|>
    shapes["model.embed_tokens.weight"] = (vocab, TEXT_HIDDEN)
    shapes["lm_head.weight"] = (vocab, TEXT_HIDDEN)
    widths = (TEXT_HIDDEN, *HEAD_WIDTHS, 2)
    for index, (fan_in, fan_out) in zip((0, 3, 5), zip(widths, widths[1:], strict=False), strict=True):
        shapes[f"rm_head.{index}.weight"] = (fan_out, fan_in)
        shapes[f"rm_head.{index}.bias"] = (fan_out,)
    save_file(seeded_state_dict(shapes, seed, getattr(torch, dtype)), str(out_dir / CHECKPOINT_FILE))
    logger.info("tiny HPSv3 written to %s", out_dir)
    return out_dir

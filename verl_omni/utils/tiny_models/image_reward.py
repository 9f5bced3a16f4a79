"""Tiny random ImageReward checkpoint in the authors' file layout (``image_reward`` scorer).

Writes ``ImageReward.pt`` under the published key names (BLIP's ``blip.visual_encoder.*`` timm
ViT names, ``blip.text_encoder.*`` BERT names, ``mlp.layers.*``), ``med_config.json``,
``vision_config.json`` (a 2-block ViT of width 32 at 224 pixels, patch 32) and ``tokenizer/``
(a BERT WordPiece tokenizer over a small vocabulary). The text width stays 768 because the
authors' code builds the head as ``MLP(768)``, so their package can load this file too.
Tensors are drawn from the seed directly (not by a library's init), so the bytes do not depend on
the transformers version.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

logger = logging.getLogger(__name__)

TINY_VISION = dict(
    image_size=224, patch_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128
)
_SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_WORDS = (
    "a an the of on in with and photo painting of cat dog red blue green yellow car tree house "
    "sitting next to under above chair table bowl fruit mountain lake sign says hello"
).split()


def _vocab() -> list[str]:
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + list("0123456789.,!?'\"-")
    tokens = _SPECIAL + sorted(set(_WORDS)) + letters + ["##" + c for c in letters]
    return list(dict.fromkeys(tokens))


def _published_name(name: str) -> str:
    """Our vision module name → BLIP's timm ViT name (inverse of the scorer's conversion)."""
    import re

    for pattern, repl in [
        (r"^embeddings\.class_embedding$", "cls_token"),
        (r"^embeddings\.position_embedding$", "pos_embed"),
        (r"^embeddings\.patch_embedding\.", "patch_embed.proj."),
        (r"^encoder\.layers\.(\d+)\.layer_norm1\.", r"blocks.\1.norm1."),
        (r"^encoder\.layers\.(\d+)\.layer_norm2\.", r"blocks.\1.norm2."),
        (r"^encoder\.layers\.(\d+)\.self_attn\.qkv\.", r"blocks.\1.attn.qkv."),
        (r"^encoder\.layers\.(\d+)\.self_attn\.projection\.", r"blocks.\1.attn.proj."),
        (r"^encoder\.layers\.(\d+)\.mlp\.", r"blocks.\1.mlp."),
        (r"^post_layernorm\.", "norm."),
    ]:
        new, hits = re.subn(pattern, repl, name)
        if hits:
            return new
    raise KeyError(name)


def build_tiny_image_reward(out_dir: Path, seed: int = 0, dtype: str = "float32") -> Path:
    """Write a tiny random ImageReward directory to ``out_dir``; the same seed gives the same files."""
    import torch
    from transformers import BertTokenizer

    from verl_omni.utils.reward_score.image_reward import ImageRewardModel
    from verl_omni.utils.tiny_models.seeded import seeded_state_dict

    out_dir = Path(out_dir)
    (out_dir / "tokenizer").mkdir(parents=True, exist_ok=True)
    vocab = _vocab()
    (out_dir / "tokenizer" / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizer(str(out_dir / "tokenizer" / "vocab.txt"), do_lower_case=True).save_pretrained(out_dir / "tokenizer")
    # ImageReward's tokenizer adds [DEC] and [ENC]: the embedding table has two more rows
    med = dict(
        architectures=["BertModel"],
        model_type="bert",
        vocab_size=len(vocab) + 2,
        hidden_size=768,
        intermediate_size=256,
        num_hidden_layers=1,
        num_attention_heads=12,
        max_position_embeddings=40,
        hidden_act="gelu",
        layer_norm_eps=1e-12,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        initializer_range=0.02,
        pad_token_id=0,
        type_vocab_size=2,
        encoder_width=TINY_VISION["hidden_size"],
        add_cross_attention=True,
    )
    (out_dir / "med_config.json").write_text(json.dumps(med, indent=2))
    (out_dir / "vision_config.json").write_text(json.dumps(TINY_VISION, indent=2))

    shapes = {}
    for name, tensor in ImageRewardModel(TINY_VISION, med).state_dict().items():
        prefix, _, rest = name.partition(".")
        if prefix == "vision":
            key = "blip.visual_encoder." + _published_name(rest)
        elif prefix == "text":
            key = "blip.text_encoder." + rest
        else:
            key = "mlp.layers." + rest
        shapes[key] = tuple(tensor.shape)
    state = seeded_state_dict(shapes, seed, getattr(torch, dtype))
    # BLIP's BERT keeps its position ids as a saved buffer
    state["blip.text_encoder.embeddings.position_ids"] = torch.arange(med["max_position_embeddings"])[None]
    torch.save(state, out_dir / "ImageReward.pt")
    logger.info("tiny ImageReward written to %s", out_dir)
    return out_dir

"""Tiny random CLIP (model, processor, aesthetic head) for the CLIP-based reward scorers.

The directory it writes loads with ``transformers.CLIPModel.from_pretrained`` and
``CLIPProcessor.from_pretrained``, exactly as a real PickScore/CLIP checkpoint does, so the
scorers' loading code is the one the tests run. The tokenizer is a byte-level BPE trained offline
on a small built-in corpus (nothing is downloaded). ``aesthetic_head.safetensors`` holds a linear
head (``weight`` [1, projection_dim], ``bias`` [1]) for the ``aesthetic`` scorer.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

logger = logging.getLogger(__name__)

AESTHETIC_HEAD_FILE = "aesthetic_head.safetensors"

_CORPUS = [
    "a photo of a cat sitting on a red chair",
    "a sign that says hello world in bold letters",
    "a painting of a mountain lake at sunset",
    "an astronaut riding a horse on the moon",
    "a bowl of fruit with apples and oranges",
    "the word open written on a shop door",
    "a blue car parked next to a green tree",
    "a close up of a dog with a ball",
]
_SPECIAL_TOKENS = ["<|startoftext|>", "<|endoftext|>"]


def _train_bpe(vocab_size: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Train a byte-level BPE and return it in CLIP's form (``</w>`` marks a word's last symbol).

    The trainer runs without ``end_of_word_suffix``: with it, ``tokenizers`` breaks count ties in
    an order that changes from run to run, and the model must be identical for a given seed. Each
    learned merge ``(a, b)`` is then emitted twice, as ``(a, b)`` and ``(a, b</w>)``, which is the
    same segmentation with CLIP's word-final symbols.
    """
    from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers
    from tokenizers.models import BPE
    from tokenizers.trainers import BpeTrainer

    tokenizer = Tokenizer(BPE(unk_token=_SPECIAL_TOKENS[1]))
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()])
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"), behavior="removed", invert=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    trainer = BpeTrainer(vocab_size=vocab_size, initial_alphabet=alphabet, show_progress=False)
    tokenizer.train_from_iterator(_CORPUS, trainer=trainer)
    learned = json.loads(tokenizer.to_str())["model"]["merges"]
    learned = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in learned]

    tokens = list(_SPECIAL_TOKENS) + alphabet + [c + "</w>" for c in alphabet]
    merges: list[tuple[str, str]] = []
    for a, b in learned:
        merges += [(a, b), (a, b + "</w>")]
        tokens += [a + b, a + b + "</w>"]
    vocab: dict[str, int] = {}
    for token in tokens:
        vocab.setdefault(token, len(vocab))
    return vocab, merges


def build_tiny_clip(out_dir: Path, seed: int = 0, dtype: str = "float32") -> Path:
    """Write a tiny random CLIP checkpoint (+ processor and aesthetic head) to ``out_dir``.

    Images are 32x32 (the processor resizes and crops to that), embeddings have 16 dims; the same
    seed gives the same files. ``dtype`` is the dtype the CLIP weights are saved in (the head
    stays float32).
    """
    import torch
    from safetensors.torch import save_file
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab, merges = _train_bpe(vocab_size=400)
    tokenizer = CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=32)
    image_processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(out_dir)

    small = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
    config = CLIPConfig(
        text_config=dict(
            vocab_size=len(vocab),
            max_position_embeddings=32,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            **small,
        ),
        vision_config=dict(image_size=32, patch_size=8, **small),
        projection_dim=16,
    )
    with torch.random.fork_rng(devices=[]):  # seed the weights without touching the caller's RNG
        torch.manual_seed(seed)
        model = CLIPModel(config).eval()
        head = torch.nn.Linear(config.projection_dim, 1)
    model.to(getattr(torch, dtype)).save_pretrained(out_dir)
    save_file(
        {"weight": head.weight.detach().contiguous(), "bias": head.bias.detach().contiguous()},
        str(out_dir / AESTHETIC_HEAD_FILE),
    )
    logger.info("tiny CLIP written to %s (vocab %d)", out_dir, len(vocab))
    return out_dir

"""A small byte-level BPE tokenizer trained offline, in the Qwen2 format.

The real Qwen tokenizers cannot be downloaded here, so tiny models get one trained on a fixed,
generated corpus of short image-prompt sentences. The vocabulary is kept small on purpose: the
Qwen-Image prompt template's fixed prefix must still tokenize to at least as many tokens as the
pipeline drops (34), as it does with the real tokenizer.
"""

from __future__ import annotations

import itertools
import json

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

# Special tokens of the Qwen2/Qwen2.5-VL chat format (text-to-image only uses the chat ones).
QWEN_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)

_COLORS = "red green blue yellow black white orange purple pink brown gray golden silver".split()
_THINGS = (
    "cat dog bird tree house car boat flower mountain river city street sign poster book cup "
    "apple chair lamp robot castle bridge forest beach cloud moon sun star garden window door"
).split()
_WORDS = (
    "a an the of on in with and near under above behind photo painting drawing picture image of "
    "that says text written reads word letters sky night day bright dark small large tiny old new "
    "shape size texture quantity spatial objects background detailed style color realistic"
).split()


def tokenizer_corpus() -> list[str]:
    """Deterministic training sentences: prompts, quoted sign text, letters and digits."""
    lines = []
    for color, thing, other in itertools.product(_COLORS, _THINGS, _THINGS[::5]):
        lines.append(f"a photo of a {color} {thing} near the {other}")
        lines.append(f'a {thing} holding a sign that says "{color.upper()} {other}"')
    lines.append(" ".join(_WORDS))
    lines.append("abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 .,:;!?'\"()-")
    return lines


def train_bpe(vocab_size: int = 1024) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Train a byte-level BPE on :func:`tokenizer_corpus`; return ``(vocab, merges)``."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(tokenizer_corpus(), trainer=trainer)
    # tokenizers exposes the learned merges only through serialization; read them back.
    state = json.loads(tok.to_str())
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in state["model"]["merges"]]
    return tok.get_vocab(), merges


def build_qwen2_tokenizer(vocab_size: int = 1024):
    """A ``transformers.Qwen2Tokenizer`` with the trained vocabulary and the Qwen special tokens."""
    from transformers import Qwen2Tokenizer

    vocab, merges = train_bpe(vocab_size)
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=merges)
    tokenizer.add_special_tokens({"additional_special_tokens": list(QWEN_SPECIAL_TOKENS[1:])})
    return tokenizer

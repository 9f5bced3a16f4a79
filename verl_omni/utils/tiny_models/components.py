"""Tiny random components shared by the SD3.5, FLUX.1 and Z-Image builders.

Text encoders with their offline-trained tokenizers (CLIP, T5, Qwen3) and the 2-D ``AutoencoderKL``
those models decode with. Each returns the object a diffusers pipeline is built from; the
builders put them together and ``save_pretrained`` the pipeline. Nothing is downloaded: the
tokenizers are trained here on the generated prompt corpus of :mod:`.tokenizer`.
"""

from __future__ import annotations

import json

from verl_omni.utils.tiny_models.clip import _train_bpe as train_clip_bpe
from verl_omni.utils.tiny_models.tokenizer import build_qwen2_tokenizer, tokenizer_corpus

# CLIP pads and truncates every prompt to this many tokens (the released encoders' length)
CLIP_MAX_LENGTH = 77
T5_SPECIAL_TOKENS = ("<pad>", "</s>", "<unk>")
# Qwen3's chat template reduced to what a one-turn user prompt with a generation prompt renders
# (``enable_thinking=True`` adds nothing after the assistant header, as in the released template)
QWEN3_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def clip_tokenizer():
    """A ``CLIPTokenizer`` (byte-level BPE in CLIP's form) padding to :data:`CLIP_MAX_LENGTH`."""
    from transformers import CLIPTokenizer

    vocab, merges = train_clip_bpe(vocab_size=400)
    return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=CLIP_MAX_LENGTH)


def clip_text_encoder(tokenizer, hidden_size: int = 32, with_projection: bool = False):
    """A 2-layer CLIP text model (``CLIPTextModelWithProjection`` for SD3, ``CLIPTextModel`` for FLUX)."""
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    config = CLIPTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=2,
        projection_dim=hidden_size,
        max_position_embeddings=CLIP_MAX_LENGTH,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return (CLIPTextModelWithProjection if with_projection else CLIPTextModel)(config).eval()


def t5_tokenizer(vocab_size: int = 400):
    """A ``T5Tokenizer`` whose Unigram vocabulary is trained on the prompt corpus (``<pad>``=0, ``</s>``=1, ``<unk>``=2)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import T5Tokenizer

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size, special_tokens=list(T5_SPECIAL_TOKENS), unk_token="<unk>", show_progress=False
    )
    tok.train_from_iterator(tokenizer_corpus(), trainer=trainer)
    # the trainer's scores differ between runs in the last bits and it orders ties at random: rounded and
    # sorted (specials first, as T5 numbers them), the same seed gives the same files
    trained = [(piece, round(float(score), 6)) for piece, score in json.loads(tok.to_str())["model"]["vocab"]]
    specials = {piece: score for piece, score in trained if piece in T5_SPECIAL_TOKENS}
    if set(specials) != set(T5_SPECIAL_TOKENS):
        raise RuntimeError(f"the trained T5 vocabulary lacks {set(T5_SPECIAL_TOKENS) - set(specials)}")
    rest = sorted((p for p in trained if p[0] not in specials), key=lambda p: (-p[1], p[0]))
    vocab = [(piece, specials[piece]) for piece in T5_SPECIAL_TOKENS] + rest
    return T5Tokenizer(vocab=vocab, extra_ids=0)


def t5_text_encoder(tokenizer, d_model: int = 64, num_heads: int = 4, umt5: bool = False):
    """A 2-layer ``T5EncoderModel`` (the SD3 and FLUX text encoder family), or its multilingual ``UMT5EncoderModel``
    sibling with ``umt5`` (Wan2.2's): the same configuration keys build either."""
    from transformers import T5Config, T5EncoderModel, UMT5Config, UMT5EncoderModel

    config_cls, model_cls = (UMT5Config, UMT5EncoderModel) if umt5 else (T5Config, T5EncoderModel)
    config = config_cls(
        vocab_size=len(tokenizer),
        d_model=d_model,
        d_kv=16,
        d_ff=2 * d_model,
        num_layers=2,
        num_heads=num_heads,
        relative_attention_num_buckets=8,
        feed_forward_proj="gated-gelu",
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
    )
    return model_cls(config).eval()


def qwen3_tokenizer():
    """The offline Qwen2-format BPE (:func:`build_qwen2_tokenizer`) with Qwen3's one-turn chat template."""
    tokenizer = build_qwen2_tokenizer()
    tokenizer.chat_template = QWEN3_CHAT_TEMPLATE
    return tokenizer


def qwen3_text_encoder(tokenizer, hidden_size: int = 32, num_hidden_layers: int = 2):
    """A Qwen3 language model (``Qwen3ForCausalLM``, tied head) of ``num_hidden_layers`` layers: Z-Image reads its
    second-to-last hidden states; FLUX.2-klein stacks those of fixed layers, so its builder asks for as many."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    ids = tokenizer.convert_tokens_to_ids
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        bos_token_id=ids("<|endoftext|>"),
        eos_token_id=ids("<|im_end|>"),
        pad_token_id=ids("<|endoftext|>"),
        tie_word_embeddings=True,
    )
    # the released checkpoints' layout (``Qwen3ForCausalLM``, weights under ``model.``): vLLM-Omni loads the text
    # encoder with AutoModelForCausalLM; diffusers reads the same hidden states through it
    return Qwen3ForCausalLM(config).eval()


def autoencoder_kl(latent_channels: int, scaling_factor: float, shift_factor: float):
    """A 3-level ``AutoencoderKL`` (4 pixels per latent cell) without quant convs, as SD3 / FLUX / Z-Image use."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3,
        block_out_channels=(8, 16, 16),
        layers_per_block=1,
        latent_channels=latent_channels,
        norm_num_groups=8,
        sample_size=32,
        scaling_factor=scaling_factor,
        shift_factor=shift_factor,
        use_quant_conv=False,
        use_post_quant_conv=False,
    ).eval()


def save_pipeline(pipeline_cls, out_dir, seed: int, dtype: str, makers: dict, **fixed):
    """Build each component of ``makers`` (name -> zero-argument factory) under its own seed, cast the
    modules to ``dtype``, and ``save_pretrained`` ``pipeline_cls(**components, **fixed)`` to ``out_dir``."""
    import torch

    components = {}
    with torch.random.fork_rng(devices=[]):  # seed the weights without touching the caller's RNG
        for offset, (name, make) in enumerate(makers.items()):
            torch.manual_seed(seed + offset)
            components[name] = make().to(getattr(torch, dtype))
    pipe = pipeline_cls(**components, **fixed)
    out_dir.mkdir(parents=True, exist_ok=True)
    pipe.save_pretrained(out_dir, safe_serialization=True)
    return out_dir

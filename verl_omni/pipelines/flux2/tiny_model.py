"""Tiny random FLUX.2-dev in diffusers format (FLUX.2 transformer with guidance embedding, FLUX.2 VAE, Mistral3).

Laid out like the released FLUX.2-dev checkpoint (``Flux2Pipeline``): a ``Mistral3ForConditionalGeneration``
text encoder (a small Pixtral vision tower the pipelines never run, a Mistral language model of which they stack
the hidden states of layers 10, 20 and 30, so the tiny one has 31 layers and both pipelines run their default
choice), its ``PixtralProcessor`` with a Mistral-style chat template (system prompt then ``[INST]`` turn), the
FLUX.2 autoencoder with its latent batch norm and a transformer with ``guidance_embeds``. The language model's head
is untied, as in the released encoder: vLLM-Omni's Mistral encoder loads it. So diffusers, vLLM-Omni and the trainer
load it through the code paths of the real model. :func:`save_flux2_pipeline` writes what the FLUX.2-klein builder
shares (its transformer has no guidance embedding).
"""

from __future__ import annotations

import logging
from pathlib import Path

from verl_omni.pipelines.flux.tiny_model import FLUX_SCHEDULER_CONFIG
from verl_omni.utils.tiny_models import components as parts
from verl_omni.utils.tiny_models.tokenizer import train_bpe

logger = logging.getLogger(__name__)

LATENT_CHANNELS = 4
TEXT_HIDDEN_SIZE = 32
# the pipelines' default ``text_encoder_out_layers`` is (10, 20, 30): hidden_states[30] of a 31-layer model is an
# intermediate layer's output, as in the released 40-layer encoder
TEXT_LAYERS = 31
# the pipelines stack three layers' states along the feature axis (dev and klein)
TEXT_STACKED_LAYERS = 3
# Mistral's special tokens, first in the vocabulary (the chat template's, the image ones PixtralProcessor looks up,
# and the padding)
MISTRAL_SPECIAL_TOKENS = (
    "<unk>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[IMG]",
    "[IMG_BREAK]",
    "[IMG_END]",
    "<pad>",
)
# the form of Mistral Small 3's template for the pipelines' conversation (a system message, one user turn, no
# generation prompt); content is a list of typed parts, as the pipelines build it, or a plain string
MISTRAL_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['content'] is string %}{% set text = message['content'] %}"
    "{% else %}{% set text = message['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text') "
    "| join('') %}{% endif %}"
    "{% if message['role'] == 'system' %}[SYSTEM_PROMPT]{{ text }}[/SYSTEM_PROMPT]"
    "{% elif message['role'] == 'user' %}[INST]{{ text }}[/INST]"
    "{% else %}{{ text }}{{ eos_token }}{% endif %}{% endfor %}"
)
# the vision tower's patch, and the processor's: the pipelines send no image
PATCH_SIZE = 16


def _transformer(text_hidden_size: int, guidance_embeds: bool):
    """A one-double-block, one-single-block ``Flux2Transformer2DModel`` reading the stacked hidden states of a
    ``text_hidden_size`` text encoder, with the guidance embedding of dev or without it (klein)."""
    from diffusers import Flux2Transformer2DModel

    return Flux2Transformer2DModel(
        patch_size=1,
        in_channels=LATENT_CHANNELS * 4,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=text_hidden_size * TEXT_STACKED_LAYERS,
        timestep_guidance_channels=32,
        axes_dims_rope=(4, 4, 4, 4),
        guidance_embeds=guidance_embeds,
    )


def _vae():
    """The FLUX.2 autoencoder (``AutoencoderKLFlux2``, latent batch norm), 3 levels: 4 pixels per latent cell."""
    from diffusers import AutoencoderKLFlux2

    return AutoencoderKLFlux2(
        down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3,
        block_out_channels=(8, 16, 16),
        layers_per_block=1,
        latent_channels=LATENT_CHANNELS,
        norm_num_groups=8,
        sample_size=32,
    ).eval()


def mistral_processor():
    """A ``PixtralProcessor``: the offline byte-level BPE behind Mistral's special tokens, with the chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PixtralImageProcessor, PixtralProcessor, PreTrainedTokenizerFast

    vocab, merges = train_bpe()
    specials = {token: i for i, token in enumerate(MISTRAL_SPECIAL_TOKENS)}
    vocab = specials | {piece: len(specials) + i for piece, i in sorted(vocab.items(), key=lambda kv: kv[1])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    # a plain prompt starts with <s>, as the released tokenizer encodes it
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", specials["<s>"])])
    backend.add_special_tokens(list(MISTRAL_SPECIAL_TOKENS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=131072,
    )
    image_processor = PixtralImageProcessor(patch_size=PATCH_SIZE, size={"longest_edge": 4 * PATCH_SIZE})
    return PixtralProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=PATCH_SIZE,
        spatial_merge_size=2,
        chat_template=MISTRAL_CHAT_TEMPLATE,
    )


def mistral3_text_encoder(tokenizer):
    """``Mistral3ForConditionalGeneration``: :data:`TEXT_LAYERS` tiny Mistral layers, an untied head, a one-layer
    Pixtral vision tower."""
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration, MistralConfig, PixtralVisionConfig

    ids = tokenizer.convert_tokens_to_ids
    text = MistralConfig(
        vocab_size=len(tokenizer),
        hidden_size=TEXT_HIDDEN_SIZE,
        intermediate_size=2 * TEXT_HIDDEN_SIZE,
        num_hidden_layers=TEXT_LAYERS,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=1024,
        rope_theta=1e9,
        bos_token_id=ids("<s>"),
        eos_token_id=ids("</s>"),
        pad_token_id=ids("<pad>"),
        tie_word_embeddings=False,
    )
    vision = PixtralVisionConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        head_dim=8,
        image_size=4 * PATCH_SIZE,
        patch_size=PATCH_SIZE,
    )
    config = Mistral3Config(
        text_config=text,
        vision_config=vision,
        image_token_index=ids("[IMG]"),
        spatial_merge_size=2,
        vision_feature_layer=-1,
        tie_word_embeddings=False,
    )
    return Mistral3ForConditionalGeneration(config).eval()


def save_flux2_pipeline(
    pipeline_cls,
    out_dir: Path,
    seed: int,
    dtype: str,
    text_encoder,
    text_hidden_size: int,
    guidance_embeds: bool,
    **fixed,
) -> Path:
    """A tiny FLUX.2 pipeline (dev's or klein's ``pipeline_cls``) saved to ``out_dir`` (:func:`parts.save_pipeline`):
    the transformer reading the stacked states of the ``text_hidden_size`` encoder built by ``text_encoder`` (a
    zero-argument factory), with or without ``guidance_embeds``, the FLUX.2 VAE and the scheduler; ``fixed``: the
    tokenizer and the pipeline's other constructor arguments. The released FLUX.2 schedulers hold FLUX.1-dev's values
    (dynamic shifting on: the μ the pipelines compute, FLUX.2's empirical μ(S, N), sets the shift)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    return parts.save_pipeline(
        pipeline_cls,
        Path(out_dir),
        seed,
        dtype,
        {
            "transformer": lambda: _transformer(text_hidden_size, guidance_embeds),
            "vae": _vae,
            "text_encoder": text_encoder,
        },
        scheduler=FlowMatchEulerDiscreteScheduler(**FLUX_SCHEDULER_CONFIG),
        **fixed,
    )


def build_tiny_flux2(out_dir: Path, seed: int = 0, dtype: str = "float32") -> Path:
    """Write a tiny random FLUX.2-dev pipeline to ``out_dir``; the same seed gives the same files.

    Returns ``out_dir``, loadable with ``Flux2Pipeline.from_pretrained(out_dir)``.
    """
    from diffusers import Flux2Pipeline

    processor = mistral_processor()
    out = save_flux2_pipeline(
        Flux2Pipeline,
        out_dir,
        seed,
        dtype,
        lambda: mistral3_text_encoder(processor.tokenizer),
        TEXT_HIDDEN_SIZE,
        guidance_embeds=True,
        tokenizer=processor,
    )
    logger.info("tiny FLUX.2-dev written to %s", out)
    return out

"""What the reward models fine-tuned from Qwen2-VL (HPSv3, VideoReward) share: the media sizing, the processor with
the reward tokens, the model built from local files, and the forward that reads a hidden state at a reward token.

Both authors' models run the language model without Qwen2-VL's 3-D (M-RoPE) position ids: every token, media ones
included, takes its sequence index in all three rotary sections. :func:`hidden_states` does the same, since the heads
were trained on those hidden states.
"""

from __future__ import annotations

import torch

# Qwen2-VL's pixels per merged vision token side (14-pixel patches, 2x2 merge), and the widest aspect ratio it takes
FACTOR = 28
MAX_ASPECT_RATIO = 200


def media_size(height: int, width: int, min_pixels: int, max_pixels: int, what: str) -> tuple[int, int]:
    """``(height, width)`` Qwen2-VL resizes an image or frame to (transformers' ``smart_resize``: multiples of 28,
    pixel count in ``[min_pixels, max_pixels]``, aspect ratio kept); an aspect ratio over 200 is refused naming
    ``what`` (e.g. "HPSv3 takes images")."""
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

    if max(height, width) > MAX_ASPECT_RATIO * min(height, width):
        raise ValueError(f"{what} with an aspect ratio up to {MAX_ASPECT_RATIO}, got {height}x{width}")
    return smart_resize(height, width, FACTOR, min_pixels, max_pixels)


def load_processor(base_dir: str, reward_tokens: list[str]):
    """The base model's processor, right padding, with the reward tokens added; and their ids."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(base_dir)
    tokenizer = processor.tokenizer
    tokenizer.padding_side = "right"
    tokenizer.add_special_tokens({"additional_special_tokens": list(reward_tokens)})
    return processor, tokenizer.convert_tokens_to_ids(list(reward_tokens))


def build_model(base_dir: str, state: dict, device: str, dtype: str) -> torch.nn.Module:
    """transformers' ``Qwen2VLModel`` of the base model's config, its vocabulary grown to the checkpoint's
    (``state``, in ``Qwen2VLModel``'s names, loaded strictly), in eval mode."""
    from transformers import Qwen2VLConfig, Qwen2VLModel
    from transformers.initialization import no_init_weights

    config = Qwen2VLConfig.from_pretrained(base_dir)
    config.text_config.vocab_size = state["language_model.embed_tokens.weight"].shape[0]
    with no_init_weights(), torch.device(device):
        model = Qwen2VLModel._from_config(config, dtype=getattr(torch, dtype))
    model.load_state_dict(state, strict=True)
    return model.eval()


def hidden_states(
    model, ids: torch.Tensor, attention_mask: torch.Tensor, media_token_id: int, features
) -> torch.Tensor:
    """The language model's last hidden states ``[B, L, D]`` with the vision ``features`` (a list per sample, as
    ``get_image_features`` / ``get_video_features`` give them) in place of the media tokens."""
    embeds = model.get_input_embeddings()(ids)
    media = (ids == media_token_id).unsqueeze(-1).expand_as(embeds)
    embeds = embeds.masked_scatter(media, torch.cat(features).to(embeds.dtype))
    return model.language_model(inputs_embeds=embeds, attention_mask=attention_mask)[0]

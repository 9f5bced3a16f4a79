"""What Qwen-Image's transformer needs on top of diffusers' Ulysses split (:mod:`verl_omni.pipelines.sequence_parallel`).

Its ``_cp_plan`` splits the text tokens as well as the image tokens, and each rank's joint attention runs on its
own ``[text slice, image slice]``; after the all-to-all a rank sees the sequence ``[text_0, image_0, text_1,
image_1, ...]``. Two things follow:

* the text length must divide by the degree: the text is padded with masked zeros to the next multiple (masked
  keys take no attention weight, so the image tokens' outputs are those of the unpadded text);
* the joint attention mask, built once over ``[text, image]``, must follow that interleaved order, or a padded
  text token of one prompt would mask an image token of the sequence: each attention call gets it reordered.
"""

from __future__ import annotations

import torch

TEXT_KEY = "encoder_hidden_states"
TEXT_MASK_KEY = "encoder_hidden_states_mask"
ATTENTION_MASK_KEY = "attention_mask"


def pad_text(kwargs: dict, degree: int) -> dict:
    """The transformer's keyword arguments with the text (and its mask) padded to a multiple of ``degree`` tokens."""
    text = kwargs.get(TEXT_KEY)
    if text is None or text.shape[1] % degree == 0:
        return kwargs
    batch, length = text.shape[:2]
    pad = -length % degree
    mask = kwargs.get(TEXT_MASK_KEY)
    if mask is None:
        mask = torch.ones(batch, length, dtype=torch.long, device=text.device)
    return kwargs | {
        TEXT_KEY: torch.nn.functional.pad(text, (0, 0, 0, pad)),
        TEXT_MASK_KEY: torch.nn.functional.pad(mask.to(torch.long), (0, pad)),
    }


def interleave_joint_mask(mask: torch.Tensor, text_local: int, degree: int) -> torch.Tensor:
    """A joint mask ``[..., T + N]`` over ``[text, image]`` reordered to ``[text_0, image_0, text_1, image_1, ...]``
    for ``degree`` ranks each holding ``text_local = T / degree`` text tokens and ``N / degree`` image tokens."""
    text_len = text_local * degree
    text, image = mask[..., :text_len], mask[..., text_len:]
    parts = zip(text.chunk(degree, dim=-1), image.chunk(degree, dim=-1), strict=True)
    return torch.cat([piece for pair in parts for piece in pair], dim=-1)


def split_joint_attention(transformer: torch.nn.Module, degree: int) -> None:
    """Register the text padding on ``transformer`` and the mask reordering on each of its blocks' attention."""

    def pad_hook(_module, args, kwargs):
        return args, pad_text(kwargs, degree)

    def mask_hook(_module, args, kwargs):
        mask = kwargs.get(ATTENTION_MASK_KEY)
        if mask is None:
            return args, kwargs
        text_local = kwargs[TEXT_KEY].shape[1]
        return args, kwargs | {ATTENTION_MASK_KEY: interleave_joint_mask(mask, text_local, degree)}

    transformer.register_forward_pre_hook(pad_hook, with_kwargs=True)
    for block in transformer.transformer_blocks:
        block.attn.register_forward_pre_hook(mask_hook, with_kwargs=True)

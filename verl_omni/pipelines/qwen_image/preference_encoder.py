"""Qwen-Image's encoder of offline preference pairs: images to the clean latents an ODE rollout records, prompts to
the embeddings it records, so that an offline Diffusion-DPO update replays them as it replays a rollout's.

What a sample must look like to the actor's ``ode_samples`` replay, and how this makes it:

* ``clean_latents`` ``[B, S, 4·z]``: the rollout's final latents before its decode, i.e. the VAE's latent mean
  (``latent_dist.mode()``) of the image, normalised by the VAE's ``latents_mean`` / ``latents_std`` (the decode
  undoes exactly that) and packed 2×2 as the transformer reads them. The image is first resized to the rollout's
  height × width by the pipeline's image processor, the way the editing pipelines prepare their source images;
* ``prompt_embeds`` / ``prompt_embeds_mask``: the text encoder's last hidden states of the adapter's prompt token
  ids (the rollout's template) without the template's system prefix, right-padded over the batch, as the rollout's
  ``encode_token_ids`` computes them.
"""

from __future__ import annotations

from pathlib import Path

import torch

from verl_omni.pipelines.qwen_image.rollout_request import QWEN_IMAGE_PROMPT_DROP_TOKENS, prompt_token_ids
from verl_omni.pipelines.recorder import CLEAN_LATENTS_KEY


class QwenImagePreferenceEncoder:
    """The VAE, text encoder and tokenizer of a Qwen-Image checkpoint (no transformer), on ``device``."""

    def __init__(self, model_path: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32):
        from diffusers import QwenImagePipeline

        self.pipe = QwenImagePipeline.from_pretrained(str(model_path), transformer=None, torch_dtype=dtype).to(device)
        self.device = torch.device(device)

    @torch.no_grad()
    def encode(self, prompts: list[str], images: list, height: int, width: int) -> dict[str, torch.Tensor]:
        """Per sample: ``prompts[i]`` and PIL ``images[i]`` as the replay's ``clean_latents`` and conditioning
        (float32, on the CPU)."""
        if len(prompts) != len(images):
            raise ValueError(f"{len(prompts)} prompts for {len(images)} images: one prompt per image")
        embeds, mask = self.encode_prompts(prompts)
        return {
            CLEAN_LATENTS_KEY: self.encode_images(images, height, width),
            "prompt_embeds": embeds,
            "prompt_embeds_mask": mask,
        }

    def encode_images(self, images: list, height: int, width: int) -> torch.Tensor:
        """Packed normalised VAE latents ``[B, S, 4·z]`` of ``images`` resized to ``height`` × ``width``."""
        pipe = self.pipe
        vae = pipe.vae
        pixels = pipe.image_processor.preprocess(images, height, width).unsqueeze(2)  # [B, 3, 1, H, W]
        latents = vae.encode(pixels.to(self.device, vae.dtype)).latent_dist.mode()  # [B, z, 1, h, w]
        view = (1, vae.config.z_dim, 1, 1, 1)
        mean = torch.tensor(vae.config.latents_mean).view(view).to(latents)
        std = torch.tensor(vae.config.latents_std).view(view).to(latents)
        latents = (latents - mean) / std
        h, w = latents.shape[-2:]
        return pipe._pack_latents(latents, len(images), vae.config.z_dim, h, w).float().cpu()

    def encode_prompts(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Embeddings ``[B, L, D]`` and mask ``[B, L]`` of ``prompts`` (template prefix dropped, right-padded)."""
        pipe = self.pipe
        ids = [prompt_token_ids(pipe.tokenizer, prompt) for prompt in prompts]
        width = max(len(row) for row in ids)
        input_ids = torch.full((len(ids), width), pipe.tokenizer.pad_token_id or 0, dtype=torch.long)
        attention = torch.zeros((len(ids), width), dtype=torch.long)
        for i, row in enumerate(ids):
            input_ids[i, : len(row)] = torch.tensor(row)
            attention[i, : len(row)] = 1
        out = pipe.text_encoder(
            input_ids=input_ids.to(self.device), attention_mask=attention.to(self.device), output_hidden_states=True
        )
        hidden = out.hidden_states[-1].float().cpu()
        lengths = [len(row) - QWEN_IMAGE_PROMPT_DROP_TOKENS for row in ids]
        embeds = hidden.new_zeros(len(ids), max(lengths), hidden.shape[-1])
        mask = torch.zeros(len(ids), max(lengths), dtype=torch.long)
        for i, length in enumerate(lengths):
            # right padding: a row's real tokens come first, the template prefix is its first tokens
            embeds[i, :length] = hidden[i, QWEN_IMAGE_PROMPT_DROP_TOKENS : QWEN_IMAGE_PROMPT_DROP_TOKENS + length]
            mask[i, :length] = 1
        return embeds, mask

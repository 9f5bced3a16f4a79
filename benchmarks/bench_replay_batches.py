"""The replay's recorded transitions per model: random tensors shaped as each model's rollout records them.

``model_throughput.py``'s replay part hands :func:`replay_batch_fn`'s function to ``actor_throughput.measure``, which
calls it with ``(module, spec, batch, text_len, vae_scale_factor, device, scheduler)``: the trained module (the A14B:
both experts), the sampling spec, the micro-batch, the model's ``REPLAY_TEXT_LEN``, its pixels per latent cell, and
the adapter's scheduler, which the function sets to the spec's schedule. Each batch holds the first recorded step
(with an expert: the first step that expert samples) and its successor, and the conditioning the adapter reads.
"""

from __future__ import annotations

import torch

# HunyuanVideo-1.5: the valid Qwen2.5-VL tokens of a short prompt in its 1000 masked ones (every token is attended,
# padding masked, so the cost is the 1000's); the ByT5 glyph stream of a prompt quoting no text is empty, as the
# rollout records it (trimmed to the longest real row)
HYV_PROMPT_TOKENS = 32
HYV_GLYPH_TOKENS = 0


def replay_batch_fn(model, args, expert: str | None = None):
    """``actor_throughput.measure``'s batch function for ``model`` (a ``bench_models.BenchModel``)."""
    from verl_omni.workers.utils.replay import prepare_scheduler

    adapter = model.load_adapter()

    def video_latents(config, spec, batch, vae_scale_factor, device, scheduler):
        """A video's recorded latents ``[batch, 2, C, F', h, w]`` and their per-sample shape, the scheduler set to
        their schedule: F' = (F - 1) / frame_multiple + 1 latent frames, h = H / s, w = W / s."""
        shape = (
            config.out_channels,
            (spec.num_frames - 1) // adapter.frame_multiple + 1,
            spec.height // vae_scale_factor,
            spec.width // vae_scale_factor,
        )
        latents = torch.randn(batch, 2, *shape, device=device)
        prepare_scheduler(adapter, scheduler, spec, adapter.schedule_seq_len(latents[:, 0]))
        return shape, latents

    def sd3(module, spec, batch, text_len, vae_scale_factor, device, scheduler) -> dict:
        cells = (spec.height // (2 * vae_scale_factor)) * (spec.width // (2 * vae_scale_factor))
        prepare_scheduler(adapter, scheduler, spec, cells)
        config = module.config
        fields = {
            "all_latents": torch.randn(batch, 2, cells, 4 * config.in_channels, device=device),
            "prompt_embeds": torch.randn(batch, text_len, config.joint_attention_dim, device=device),
            "pooled_prompt_embeds": torch.randn(batch, config.pooled_projection_dim, device=device),
        }
        if spec.uses_cfg:
            fields["negative_prompt_embeds"] = torch.randn_like(fields["prompt_embeds"])
            fields["negative_pooled_prompt_embeds"] = torch.randn_like(fields["pooled_prompt_embeds"])
        fields["all_timesteps"] = scheduler.timesteps[:1].expand(batch, 1).to(device)
        return fields

    def flux2(module, spec, batch, text_len, vae_scale_factor, device, scheduler) -> dict:
        # packed tokens [S, 4C]: one per 2×2 latent cells
        cells = (spec.height // (2 * vae_scale_factor)) * (spec.width // (2 * vae_scale_factor))
        prepare_scheduler(adapter, scheduler, spec, cells)
        config = module.config
        fields = {
            "all_latents": torch.randn(batch, 2, cells, config.in_channels, device=device),
            "all_timesteps": scheduler.timesteps[:1].expand(batch, 1).to(device),
            "prompt_embeds": torch.randn(batch, text_len, config.joint_attention_dim, device=device),
        }
        if spec.uses_cfg:
            fields["negative_prompt_embeds"] = torch.randn_like(fields["prompt_embeds"])
        return fields

    def wan(module, spec, batch, text_len, vae_scale_factor, device, scheduler) -> dict:
        # latents [C, F', h, w]: F' = (F - 1)/4 + 1 latent frames, h = H/s, w = W/s (s: 16 for TI2V-5B, 8 for A14B)
        config = module.transformer.config if expert else module.config
        shape, latents = video_latents(config, spec, batch, vae_scale_factor, device, scheduler)
        timesteps = scheduler.timesteps
        if expert:
            high = adapter.high_noise(timesteps)
            timesteps = timesteps[high if expert == model.experts[0] else ~high]
        fields = {
            "all_latents": latents,
            "all_timesteps": timesteps[:1].expand(batch, 1).to(device),
            "prompt_embeds": torch.randn(batch, text_len, config.text_dim, device=device),
            "prompt_embeds_mask": torch.ones(batch, text_len, dtype=torch.long, device=device),
        }
        if spec.uses_cfg:
            fields["negative_prompt_embeds"] = torch.randn_like(fields["prompt_embeds"])
            fields["negative_prompt_embeds_mask"] = fields["prompt_embeds_mask"].clone()
        if "image_condition" in adapter.conditioning_keys:
            # image-to-video: the source image's mask and latent channels, joined to the latents' before the blocks
            fields["image_condition"] = torch.randn(batch, config.in_channels - shape[0], *shape[1:], device=device)
        return fields

    def hunyuan_video(module, spec, batch, text_len, vae_scale_factor, device, scheduler) -> dict:
        # latents [C, F', h, w] (4 frames and 16 pixels per latent cell), two masked prompt streams
        config = module.config
        _, latents = video_latents(config, spec, batch, vae_scale_factor, device, scheduler)
        mask = torch.zeros(batch, text_len, dtype=torch.long, device=device)
        mask[:, :HYV_PROMPT_TOKENS] = 1
        streams = {
            "prompt_embeds": torch.randn(batch, text_len, config.text_embed_dim, device=device),
            "prompt_embeds_mask": mask,
            "prompt_embeds_2": torch.randn(batch, HYV_GLYPH_TOKENS, config.text_embed_2_dim, device=device),
            "prompt_embeds_2_mask": torch.ones(batch, HYV_GLYPH_TOKENS, dtype=torch.long, device=device),
        }
        fields = {"all_latents": latents, "all_timesteps": scheduler.timesteps[:1].expand(batch, 1).to(device)}
        fields |= streams
        if spec.uses_cfg:
            fields |= {f"negative_{key}": value.clone() for key, value in streams.items()}
        return fields

    def ltx2(module, spec, batch, text_len, vae_scale_factor, device, scheduler) -> dict:
        # the joint latent [S_v + S_a, C]: one video token per latent cell, then one audio token per latent audio
        # frame (the audio VAE's mel frames per second / its 4x, over the video's duration at the release's fps)
        config = module.config
        frames, height, width = adapter.video_grid(spec, vae_scale_factor)
        per_second = config.audio_sampling_rate / config.audio_hop_length / config.audio_scale_factor
        audio_tokens = round(spec.num_frames / adapter.video_fps * per_second)
        tokens = frames * height * width + audio_tokens
        prepare_scheduler(adapter, scheduler, spec, frames * height * width)
        contexts = {
            "prompt_embeds": torch.randn(batch, text_len, config.caption_channels, device=device),
            "audio_prompt_embeds": torch.randn(batch, text_len, config.caption_channels, device=device),
        }
        fields = {
            "all_latents": torch.randn(batch, 2, tokens, config.in_channels, device=device),
            "all_timesteps": scheduler.timesteps[:1].expand(batch, 1).to(device),
        } | contexts
        if spec.uses_cfg:
            fields |= {f"negative_{key}": torch.randn_like(value) for key, value in contexts.items()}
        return fields

    batches = {"sd3": sd3, "flux2_klein": flux2, "flux2": flux2, "hunyuan_video_1_5": hunyuan_video, "ltx2": ltx2}
    return batches.get(model.name, wan if model.name.startswith("wan2_2") else None)

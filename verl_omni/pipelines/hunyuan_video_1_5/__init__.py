"""HunyuanVideo-1.5 text-to-video and image-to-video: one 3-D DiT reading the noise latents beside a condition (zero
in text to video; the source image's first-frame latents and mask in image to video), Qwen2.5-VL prompt states and
ByT5 glyph states. Rollout on vLLM-Omni's ``HunyuanVideo15Pipeline`` / ``HunyuanVideo15I2VPipeline`` with the shared
recorder, training on diffusers' ``HunyuanVideo15Transformer3DModel``, tiny random builders
(``hunyuan_video_1_5``, ``hunyuan_video_1_5_i2v``; ``docs/guide/models.md``)."""

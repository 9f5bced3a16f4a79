"""Qwen-Image-Edit "Plus" (2509 / 2511): instruction-based editing of 1 to 4 source images
(``QwenImageEditPlusPipeline`` checkpoints).

Qwen-Image-Edit's rollout, replay and tiny model (``verl_omni.pipelines.qwen_image_edit``) with the Plus
pipeline's differences: a numbered ``Picture i:`` block per source image in the prompt, the vision tower
reading each image at 384² pixels while the VAE reads it at 1024², and every image's latent tokens
appended after the noise tokens.
"""

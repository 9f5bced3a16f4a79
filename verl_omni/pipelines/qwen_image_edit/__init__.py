"""Qwen-Image-Edit: instruction-based editing of one source image (``QwenImageEditPipeline`` checkpoints).

The rollout pipeline, the training adapter and the tiny builder of the model; the transformer, VAE
and schedule are Qwen-Image's (``verl_omni.pipelines.qwen_image``), the prompt is encoded with the
source image by the Qwen2.5-VL text encoder, and the source image's VAE latents ride beside the
noise latents in the transformer's sequence.
"""

"""FLUX.1-Kontext: instruction-based editing of one source image (``FluxKontextPipeline`` checkpoints).

The rollout pipeline, the training adapter and the tiny builder of the model. The transformer, text encoders,
VAE, schedule and guidance embedding are FLUX.1-dev's (``verl_omni.pipelines.flux``); the source image's packed
VAE latents ride after the noise tokens in the transformer's sequence, at position ids (1, row, column).
"""

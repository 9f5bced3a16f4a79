"""FLUX.2-klein (``Flux2KleinPipeline``): a Qwen3-conditioned FLUX.2 transformer, base (CFG) or step-distilled."""

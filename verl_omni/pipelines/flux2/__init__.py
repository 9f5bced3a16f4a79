"""FLUX.2-dev (``Flux2Pipeline``): a Mistral3-conditioned, guidance-distilled FLUX.2 transformer; its transformer,
schedule and velocity are shared with FLUX.2-klein (``flux2_klein`` subclasses this package's adapter)."""

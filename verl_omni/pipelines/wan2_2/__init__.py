"""Wan2.2 text-to-video (TI2V-5B, one transformer): rollout on vLLM-Omni's ``Wan22Pipeline`` with the shared
recorder, training on diffusers' ``WanTransformer3DModel``, and the tiny random builder (``docs/models.md``)."""

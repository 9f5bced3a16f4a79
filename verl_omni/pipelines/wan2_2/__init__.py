"""Wan2.2 text-to-video: TI2V-5B (one transformer) and the two-expert A14B (a LoRA over both experts, ``experts.py``;
found by ``Wan22TrainingAdapter.for_checkpoint``). Rollout on vLLM-Omni's ``Wan22Pipeline`` with the shared recorder,
training on diffusers' ``WanTransformer3DModel``, tiny random builders (``docs/guide/models.md``)."""

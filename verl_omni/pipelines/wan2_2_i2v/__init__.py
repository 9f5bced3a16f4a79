"""Wan2.2 image-to-video A14B: the T2V A14B's two experts (``verl_omni.pipelines.wan2_2``) denoising beside the
source image's first-frame condition, concatenated on channels. Rollout on vLLM-Omni's ``Wan22I2VPipeline`` with the
shared recorder, training on diffusers' ``WanTransformer3DModel`` pair, a tiny random builder
(``python -m verl_omni.utils.tiny_models wan2_2_i2v_a14b``; ``docs/guide/models.md``)."""

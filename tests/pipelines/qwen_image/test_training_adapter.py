"""Qwen-Image's training adapter: true CFG's two passes as one batched transformer call (CPU, fp32).

The replay runs the conditional and the negative pass as one call on twice the rows, the texts padded to the
longer one and the padding masked out of attention. It must give the velocity of the two separate passes,
which is what the rollout computes; every trainer test's rollout-vs-actor check covers it again end to end.
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def transformer(tiny_qwen_image_path):
    from verl_omni.pipelines.qwen_image.training_adapter import QwenImageTrainingAdapter

    return QwenImageTrainingAdapter.load_transformer(tiny_qwen_image_path).eval()


def _prompt(batch: int, length: int, dim: int, padded_row: int | None):
    from verl_omni.pipelines.qwen_image.training_adapter import PromptEmbeds

    mask = torch.ones(batch, length, dtype=torch.long)
    if padded_row is not None:
        mask[padded_row, length // 2 :] = 0
    return PromptEmbeds(torch.randn(batch, length, dim), None if padded_row is None else mask)


@pytest.mark.parametrize(
    ("prompt_len", "negative_len", "padded_row"),
    [(7, 3, None), (3, 7, None), (5, 5, None), (7, 3, 1)],
    ids=["negative-shorter", "negative-longer", "same-length", "prompt-padded"],
)
def test_batched_cfg_equals_the_two_separate_passes(transformer, prompt_len, negative_len, padded_row):
    from verl_omni.pipelines.qwen_image.training_adapter import QwenImageTrainingAdapter as Adapter

    torch.manual_seed(0)
    batch, dim = 3, transformer.config.joint_attention_dim
    latents = torch.randn(batch, 16, transformer.config.in_channels, requires_grad=True)
    timesteps = torch.tensor([900.0, 700.0, 500.0])
    prompt = _prompt(batch, prompt_len, dim, padded_row)
    negative = _prompt(batch, negative_len, dim, None)
    shapes = Adapter.img_shapes(batch, 8, 8)
    velocities, grads = [], []
    for batch_cfg in (True, False):
        v = Adapter.predict_velocity(
            transformer, latents, timesteps, prompt, shapes, negative, 4.0, batch_cfg=batch_cfg
        )
        (grad,) = torch.autograd.grad(v.square().sum(), latents)
        velocities.append(v.detach())
        grads.append(grad)
    assert velocities[0].abs().max() > 0.1
    torch.testing.assert_close(velocities[0], velocities[1], rtol=0, atol=1e-5)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-4)


def test_stacked_texts_pad_the_shorter_and_keep_an_all_real_batch_unmasked():
    from verl_omni.pipelines.qwen_image.training_adapter import PromptEmbeds, _stacked

    full = PromptEmbeds(torch.randn(2, 4, 8), None)
    stacked = _stacked(full, PromptEmbeds(torch.randn(2, 4, 8), None))
    assert stacked.embeds.shape == (4, 4, 8) and stacked.mask is None
    stacked = _stacked(full, PromptEmbeds(torch.randn(2, 2, 8), None))
    assert stacked.embeds.shape == (4, 4, 8)
    assert stacked.mask.tolist() == [[1, 1, 1, 1]] * 2 + [[1, 1, 0, 0]] * 2
    assert stacked.embeds[2:, 2:].abs().sum() == 0

"""Offline Diffusion-DPO's data path: preference rows -> the update batch the online step would have made.

The encoder's outputs are checked against diffusers' own Qwen-Image code (its ``encode_prompt`` and the VAE's
latents the pipeline's decode undoes), and the batch against the algorithm's pair layout.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from verl_omni.algorithms import NOISE_GROUP_KEY
from verl_omni.algorithms.diffusion_dpo import PREFERENCE_KEY, DiffusionDPO, DiffusionDPOConfig
from verl_omni.pipelines.recorder import CLEAN_LATENTS_KEY
from verl_omni.pipelines.sampling import SamplingSpec
from verl_omni.utils.dataset.preference_data import PreferencePairs, preference_row
from verl_omni.utils.dataset.t2i_prompts import write_parquet

SIZE = 32
PROMPTS = ("a red cat", "a photo of a small blue boat near a river under the moon at night")


def _image(seed: int, size: tuple[int, int]) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (*size[::-1], 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def encoder(tiny_qwen_image_path):
    from verl_omni.pipelines.qwen_image.training_adapter import QwenImageTrainingAdapter

    return QwenImageTrainingAdapter.build_preference_encoder(tiny_qwen_image_path)


def test_prompt_embeddings_are_diffusers_qwen_image_embeddings(encoder):
    embeds, mask = encoder.encode_prompts(list(PROMPTS))
    with torch.no_grad():
        expected, expected_mask = encoder.pipe.encode_prompt(list(PROMPTS), device="cpu")
    assert torch.equal(mask, expected_mask.long())
    assert mask[0].sum() < mask[1].sum()  # the short prompt is right-padded
    torch.testing.assert_close(embeds * mask[..., None], expected.float() * expected_mask[..., None], rtol=0, atol=0)


def test_clean_latents_are_what_the_pipeline_decode_undoes(encoder):
    images = [_image(0, (40, 24)), _image(1, (SIZE, SIZE))]  # the first is resized to the rollout's size
    clean = encoder.encode_images(images, SIZE, SIZE)
    pipe, vae = encoder.pipe, encoder.pipe.vae
    scale = pipe.vae_scale_factor
    assert clean.shape == (2, (SIZE // scale // 2) ** 2, 4 * vae.config.z_dim)
    # the rollout's decode: unpack, then latents * std + mean into the VAE
    unpacked = pipe._unpack_latents(clean, SIZE, SIZE, scale)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    resized = [np.asarray(image.resize((SIZE, SIZE), Image.LANCZOS), dtype=np.float32) for image in images]
    pixels = torch.tensor(np.stack(resized)).permute(0, 3, 1, 2)[:, :, None] / 127.5 - 1
    with torch.no_grad():
        expected = vae.encode(pixels).latent_dist.mode()
    torch.testing.assert_close(unpacked * std + mean, expected, rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """A parquet of two pairs, one image a file, the others bytes."""
    import io

    folder = tmp_path_factory.mktemp("offline_pairs")
    _image(2, (SIZE, SIZE)).save(folder / "chosen.png")
    buffer = io.BytesIO()
    _image(3, (16, 16)).save(buffer, format="PNG")
    rows = [
        preference_row(PROMPTS[i], {"image": str(folder / "chosen.png")}, {"bytes": buffer.getvalue()}, i, "train", "t")
        for i in range(2)
    ]
    return PreferencePairs(write_parquet(rows, folder / "prefs.parquet"))


def test_a_step_batch_is_the_online_pair_layout(encoder, pairs):
    from verl_omni.trainer.diffusion.offline_preferences import PreferenceBatches

    assert [row["prompt"] for row in pairs] == list(PROMPTS)
    spec = SamplingSpec.resolve({"height": SIZE, "width": SIZE, "num_inference_steps": 4, "noise_level": 0.0})
    batch = PreferenceBatches(encoder, spec).batch([pairs[0], pairs[1]], step=7)
    assert list(batch.non_tensor_batch["uid"]) == ["pair-7-0", "pair-7-0", "pair-7-1", "pair-7-1"]
    assert batch.batch["rm_scores"].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert batch.meta_info["sampling_spec"]["height"] == SIZE
    # a pair's two samples share the prompt embeddings, and its images differ
    embeds, clean = batch.batch["prompt_embeds"], batch.batch[CLEAN_LATENTS_KEY]
    assert torch.equal(embeds[0], embeds[1]) and not torch.equal(embeds[1], embeds[2])
    assert not torch.equal(clean[0], clean[1]) and torch.equal(clean[0], clean[2])
    # the algorithm pairs each (chosen, rejected) in place and trains every row
    rows = DiffusionDPO.arrange_update(batch.batch["rm_scores"], batch.non_tensor_batch["uid"], DiffusionDPOConfig())
    assert rows.order.tolist() == [0, 1, 2, 3] and bool(rows.keep.all())
    assert rows.keys[PREFERENCE_KEY].tolist() == [1.0, -1.0, 1.0, -1.0]
    assert rows.keys[NOISE_GROUP_KEY].tolist() == [0, 0, 1, 1]


def test_an_unreadable_image_is_named_with_its_row_at_the_step(encoder, pairs):
    from verl_omni.trainer.diffusion.offline_preferences import PreferenceBatches

    broken = {**pairs[1], "rejected": {"bytes": b"not an image"}}
    spec = SamplingSpec.resolve({"height": SIZE, "width": SIZE, "num_inference_steps": 4, "noise_level": 0.0})
    with pytest.raises(ValueError, match=r"prefs.parquet row 1 \(rejected\): source image 12 bytes is not a readable"):
        PreferenceBatches(encoder, spec).batch([pairs[0], broken], step=1)


def test_a_prompt_that_is_not_text_or_messages_names_the_row(tmp_path):
    path = write_parquet([{"prompt": 3, "chosen": {"image": "a.png"}, "rejected": {"image": "b.png"}}], tmp_path / "p")
    with pytest.raises(ValueError, match=r"row 0: the prompt is a text or chat messages"):
        PreferencePairs(path)

"""Model-free scorers: JPEG (in)compressibility (real PIL encoding) and the toy brightness."""

import asyncio

import pytest
import torch

from verl_omni.utils.reward_score import ScoreBatch, get_scorer_cls


def flat_and_noise():
    flat = torch.full((1, 3, 64, 64), 128, dtype=torch.uint8)
    noise = torch.randint(0, 256, (1, 3, 64, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    return ScoreBatch(torch.cat([flat, noise]), ["flat", "noise"])


def test_jpeg_compressibility_orders_flat_image_above_noise():
    flat, noise = asyncio.run(get_scorer_cls("jpeg_compressibility")().score(flat_and_noise()))
    assert flat > noise
    assert -1.5 < noise < flat < 0


def test_jpeg_incompressibility_orders_noise_above_flat_image():
    flat, noise = asyncio.run(get_scorer_cls("jpeg_incompressibility")().score(flat_and_noise()))
    assert noise > flat > 0
    assert noise > 5 * flat


def test_brightness_is_mean_pixel_value_over_255():
    black_white = ScoreBatch(
        torch.stack([torch.zeros(3, 8, 8), torch.full((3, 8, 8), 255.0)]).to(torch.uint8), ["a", "b"]
    )
    assert asyncio.run(get_scorer_cls("brightness")().score(black_white)) == [0.0, 1.0]
    flat, noise = asyncio.run(get_scorer_cls("brightness")().score(flat_and_noise()))
    assert flat == pytest.approx(128 / 255) and 0.45 < noise < 0.55

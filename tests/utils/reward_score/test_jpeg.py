"""JPEG (in)compressibility scorers: no model, real PIL encoding."""

import asyncio

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

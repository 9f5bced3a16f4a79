"""pickscore / clip_score / aesthetic on the tiny random CLIP, loaded from disk by path."""

import asyncio
import math

import pytest
import torch
from safetensors.torch import load_file
from transformers import CLIPModel, CLIPProcessor

from verl_omni.utils.reward_score import ScoreBatch, build_params, get_scorer_cls

PROMPTS = ["a red cat", "a sign that says hello", "a mountain lake", "a blue car", "a bowl of fruit"]


def make(name, model_dir, **params):
    cls = get_scorer_cls(name)
    return cls(build_params(cls.params_cls, {"model_path": str(model_dir), **params}, "test"))


@pytest.fixture(scope="module")
def batch():
    gen = torch.Generator().manual_seed(1)
    return ScoreBatch(torch.randint(0, 256, (5, 3, 40, 48), dtype=torch.uint8, generator=gen), PROMPTS)


@pytest.fixture(scope="module")
def reference(tiny_clip_dir, batch):
    """Scores computed straight from transformers' CLIPModel forward, independently of the scorers."""
    model = CLIPModel.from_pretrained(tiny_clip_dir).eval()
    processor = CLIPProcessor.from_pretrained(tiny_clip_dir)
    inputs = processor(text=batch.prompts, images=list(batch.images), return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model(**inputs)
    return {
        "logits": out.logits_per_image.diagonal(),
        "scale": model.logit_scale.exp(),
        "image_embeds": out.image_embeds,
    }


def test_pickscore_equals_clip_logits_per_image(tiny_clip_dir, batch, reference):
    scores = asyncio.run(make("pickscore", tiny_clip_dir, batch_size=2).score(batch))
    assert scores == pytest.approx(reference["logits"].tolist(), abs=1e-4)


def test_clip_score_is_cosine_similarity(tiny_clip_dir, batch, reference):
    scores = asyncio.run(make("clip_score", tiny_clip_dir).score(batch))
    expected = (reference["logits"] / reference["scale"]).tolist()
    assert scores == pytest.approx(expected, abs=1e-5)
    assert all(-1.0 <= s <= 1.0 for s in scores)
    assert len(set(round(s, 6) for s in scores)) == len(scores)


def test_clip_scores_do_not_depend_on_batch_size(tiny_clip_dir, batch):
    one = asyncio.run(make("clip_score", tiny_clip_dir, batch_size=1).score(batch))
    all_at_once = asyncio.run(make("clip_score", tiny_clip_dir, batch_size=8).score(batch))
    assert one == pytest.approx(all_at_once, abs=1e-5)


def test_aesthetic_is_linear_head_on_unit_image_embedding(tiny_clip_dir, batch, reference):
    scores = asyncio.run(make("aesthetic", tiny_clip_dir, batch_size=3).score(batch))
    head = load_file(str(tiny_clip_dir / "aesthetic_head.safetensors"))
    embeds = torch.nn.functional.normalize(reference["image_embeds"], dim=-1)
    expected = (embeds @ head["weight"].T + head["bias"]).squeeze(-1)
    assert scores == pytest.approx(expected.tolist(), abs=1e-5)
    assert all(math.isfinite(s) for s in scores)

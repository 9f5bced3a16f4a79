"""The ``hpsv3`` scorer on a tiny random HPSv3 checkpoint (``tiny_models hpsv3``) in the released file layout.

The expected scores come from the authors' own package (``hpsv3`` 1.0.0's ``HPSv3RewardInferencer``) run on the
same checkpoint file, images and prompts (``reference/score_hpsv3_with_reference_package.py``; the package pins
transformers 4.45 and cannot be installed beside verl_omni, see there).
"""

import asyncio
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from verl_omni.utils.reward_score import ScoreBatch, build_params, get_scorer_cls
from verl_omni.utils.reward_score.hpsv3 import resized_size

REFERENCE = json.loads(Path(__file__).with_name("reference").joinpath("hpsv3_reference_scores.json").read_text())


def make(model_path, **params):
    cls = get_scorer_cls("hpsv3")
    return cls(build_params(cls.params_cls, {"model_path": str(model_path), "dtype": "float32", **params}, "test"))


@pytest.fixture(scope="module")
def tiny_hpsv3_dir(tiny_model):
    return tiny_model("hpsv3")


@pytest.fixture(scope="module")
def reference_batch():
    generator = torch.Generator().manual_seed(REFERENCE["seed"])
    images = torch.randint(0, 256, tuple(REFERENCE["shape"]), dtype=torch.uint8, generator=generator)
    return ScoreBatch(images, REFERENCE["prompts"])


@pytest.mark.parametrize("batch_size", [1, 2, 4])
def test_scores_equal_the_reference_packages_mu(tiny_hpsv3_dir, reference_batch, batch_size):
    """Batched (right-padded prompts of different lengths) or one at a time, the score is the package's mu."""
    scores = asyncio.run(make(tiny_hpsv3_dir, batch_size=batch_size).score(reference_batch))
    assert scores == pytest.approx(REFERENCE["hpsv3"]["mu"], abs=1e-5)
    # mu, not sigma: the two differ by far more than the tolerance on this checkpoint
    assert scores != pytest.approx(REFERENCE["hpsv3"]["sigma"], abs=1e-2)
    assert len({round(s, 5) for s in scores}) == len(scores)


def test_the_prompt_and_the_image_change_the_score(tiny_hpsv3_dir, reference_batch):
    scorer = make(tiny_hpsv3_dir)
    base = asyncio.run(scorer.score(reference_batch))
    other_prompt = asyncio.run(scorer.score(ScoreBatch(reference_batch.images, ["a bowl of fruit"] * 3)))
    flipped = asyncio.run(scorer.score(ScoreBatch(reference_batch.images.flip(-1), reference_batch.prompts)))
    assert all(abs(a - b) > 1e-6 for a, b in zip(base, other_prompt, strict=True))
    assert all(abs(a - b) > 1e-6 for a, b in zip(base, flipped, strict=True))


def test_bfloat16_scores_follow_float32(tiny_hpsv3_dir, reference_batch):
    """The authors' dtype: Qwen2-VL in bfloat16, the head in float32."""
    scores = asyncio.run(make(tiny_hpsv3_dir, dtype="bfloat16").score(reference_batch))
    assert scores == pytest.approx(REFERENCE["hpsv3"]["mu"], abs=0.02)


@pytest.mark.parametrize(
    "size, expected",
    [((40, 48), (420, 504)), ((1024, 1024), (448, 448)), ((720, 1280), (336, 588)), ((1, 150), (56, 5488))],
)
def test_images_are_resized_to_about_256_tokens_of_28_pixels(size, expected):
    """Values from the authors' package (its ``smart_resize`` with both pixel bounds at 256·28·28)."""
    assert resized_size(*size) == expected


def test_an_extreme_aspect_ratio_is_refused():
    with pytest.raises(ValueError, match="aspect ratio up to 200, got 1x300"):
        resized_size(1, 300)


def test_the_checkpoint_has_the_released_names(tiny_hpsv3_dir):
    state = load_file(str(Path(tiny_hpsv3_dir, "HPSv3.safetensors")))
    assert {k.split(".")[0] for k in state} == {"model", "visual", "lm_head", "rm_head"}
    assert sorted(k for k in state if k.startswith("rm_head.")) == [
        f"rm_head.{i}.{p}" for i in (0, 3, 5) for p in ("bias", "weight")
    ]
    assert state["rm_head.5.weight"].shape[0] == 2  # (mu, sigma)


def test_missing_weights_name_the_directory(tmp_path, reference_batch):
    missing = tmp_path / "HPSv3"
    with pytest.raises(FileNotFoundError, match=rf"model_path='{missing}' is not a directory; it must hold HPSv3's"):
        make(missing).score_sync(reference_batch)
    with pytest.raises(FileNotFoundError, match=rf"model_path='{tmp_path}' has no HPSv3.safetensors: put HPSv3's"):
        make(tmp_path).score_sync(reference_batch)
    cls = get_scorer_cls("hpsv3")
    with pytest.raises(ValueError, match=r"^k\.model_path must name a local directory holding HPSv3's"):
        build_params(cls.params_cls, {}, "k")


def test_a_base_directory_without_the_config_names_its_key(tiny_hpsv3_dir, tmp_path, reference_batch):
    with pytest.raises(FileNotFoundError, match=rf"base_model_path='{tmp_path}' has no config.json: put the base"):
        make(tiny_hpsv3_dir, base_model_path=str(tmp_path)).score_sync(reference_batch)


def test_a_checkpoint_without_the_reward_head_is_refused(tiny_hpsv3_dir, tmp_path, reference_batch):
    state = load_file(str(Path(tiny_hpsv3_dir, "HPSv3.safetensors")))
    save_file({k: v for k, v in state.items() if not k.startswith("rm_head.")}, str(tmp_path / "HPSv3.safetensors"))
    with pytest.raises(ValueError, match=r"has no HPSv3 reward head \(rm_head"):
        make(tmp_path, base_model_path=str(tiny_hpsv3_dir)).score_sync(reference_batch)


@pytest.mark.parametrize(
    "params, message",
    [({"dtype": "float64"}, r"k\.dtype must be one of float32, bfloat16, float16"), ({"batch_size": 0}, "batch_size")],
)
def test_bad_params_are_refused_by_key(params, message):
    cls = get_scorer_cls("hpsv3")
    with pytest.raises(ValueError, match=message):
        build_params(cls.params_cls, {"model_path": "/m", **params}, "k")

"""hpsv2 and image_reward on tiny random checkpoints of their real architectures, built by the project.

The expected scores come from the authors' own packages run on the same checkpoint files, images
and prompts (``reference/score_with_reference_packages.py``; the packages cannot be installed beside
verl_omni, see there). ``hpsv2`` needs ``open_clip_torch`` (the ``rewards`` extra, installed by
``scripts/setup_env.sh``); its tests skip only where that package is absent.
"""

import asyncio
import json
from pathlib import Path

import pytest
import torch

from verl_omni.utils.reward_score import ScoreBatch, build_params, get_scorer_cls
from verl_omni.utils.reward_score.local_files import import_extra
from verl_omni.utils.tiny_models import build_tiny_model

REFERENCE = json.loads(Path(__file__).with_name("reference").joinpath("reference_scores.json").read_text())


def make(name, model_dir, **params):
    cls = get_scorer_cls(name)
    return cls(build_params(cls.params_cls, {"model_path": str(model_dir), **params}, "test"))


@pytest.fixture(scope="module")
def reference_batch():
    generator = torch.Generator().manual_seed(REFERENCE["seed"])
    images = torch.randint(0, 256, tuple(REFERENCE["shape"]), dtype=torch.uint8, generator=generator)
    return ScoreBatch(images, REFERENCE["prompts"])


@pytest.fixture(scope="module")
def tiny_hps_dir(tmp_path_factory):
    pytest.importorskip("open_clip", reason="the rewards extra (open_clip_torch) is not installed")
    return build_tiny_model("hps", tmp_path_factory.mktemp("tiny_hps"), seed=0)


@pytest.fixture(scope="module")
def tiny_image_reward_dir(tmp_path_factory):
    return build_tiny_model("image_reward", tmp_path_factory.mktemp("tiny_image_reward"), seed=0)


@pytest.fixture
def model_dir(request):
    return request.getfixturevalue({"hpsv2": "tiny_hps_dir", "image_reward": "tiny_image_reward_dir"}[request.param])


SCORERS = ["hpsv2", "image_reward"]


@pytest.mark.parametrize("name, model_dir", [(n, n) for n in SCORERS], indirect=["model_dir"])
def test_scores_equal_the_reference_package_scores(name, model_dir, reference_batch):
    scores = asyncio.run(make(name, model_dir, batch_size=2).score(reference_batch))
    assert scores == pytest.approx(REFERENCE[name], abs=1e-5)
    assert len(set(round(s, 5) for s in scores)) == len(scores)


@pytest.mark.parametrize("name, model_dir", [(n, n) for n in SCORERS], indirect=["model_dir"])
def test_scores_do_not_depend_on_batch_size(name, model_dir, reference_batch):
    one = asyncio.run(make(name, model_dir, batch_size=1).score(reference_batch))
    all_at_once = asyncio.run(make(name, model_dir, batch_size=8).score(reference_batch))
    assert one == pytest.approx(all_at_once, abs=1e-5)


@pytest.mark.parametrize("name, model_dir", [(n, n) for n in SCORERS], indirect=["model_dir"])
def test_prompt_changes_the_score(name, model_dir, reference_batch):
    other = ScoreBatch(reference_batch.images, ["a bowl of fruit on a table"] * len(reference_batch))
    base = asyncio.run(make(name, model_dir).score(reference_batch))
    changed = asyncio.run(make(name, model_dir).score(other))
    assert all(abs(a - b) > 1e-6 for a, b in zip(base, changed, strict=True))


@pytest.mark.parametrize("name", SCORERS)
def test_missing_directory_names_the_key(name, tmp_path, reference_batch):
    scorer = make(name, tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"model_path=.*nowhere.* is not a directory"):
        asyncio.run(scorer.score(reference_batch))


@pytest.mark.parametrize("name, missing", [("hpsv2", "HPS_v2.1_compressed.pt"), ("image_reward", "ImageReward.pt")])
def test_missing_checkpoint_file_says_what_to_put_there(name, missing, tmp_path, reference_batch):
    scorer = make(name, tmp_path)
    with pytest.raises(FileNotFoundError, match=rf"model_path=.* has no {missing}: put"):
        asyncio.run(scorer.score(reference_batch))


def test_empty_model_path_is_refused_when_configured():
    cls = get_scorer_cls("image_reward")
    with pytest.raises(ValueError, match=r"k\.model_path must name a local ImageReward directory"):
        build_params(cls.params_cls, {}, "k")


def test_missing_optional_package_names_the_extra():
    with pytest.raises(
        ImportError, match=r"scorer 'hpsv2' needs the 'no_such_pkg_x' package: pip install 'verl_omni\[rewards\]'"
    ):
        import_extra("no_such_pkg_x", "hpsv2")

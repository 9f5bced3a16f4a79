"""The ``paddle_ocr`` scorer (Flow-GRPO's OCR reward) on the tiny PaddleOCR models: its scores equal those of
PaddleOCR's own ``ocr()`` pushed through the published formula in a separate process of the same environment
(``reference/paddle_ocr_reference.py``), they reach the reward through the reward manager, and a missing model is
an error naming the key and where to get it.

One module, one scorer process: the scorer is the reward manager's own (PaddleOCR takes seconds to import, and
the suite's workers take whole files, so a second file would build the environment and the models again)."""

import asyncio
import json
import subprocess
from pathlib import Path

import numpy
import pytest
import torch
from omegaconf import OmegaConf
from verl import DataProto

from verl_omni.reward_loop import DiffusionRewardManager
from verl_omni.utils.reward_score import ScoreBatch
from verl_omni.utils.reward_score.environment import CACHE_ENV_VAR
from verl_omni.utils.reward_score.paddle_ocr import PaddleOcrParams, PaddleOcrScorer

REFERENCE = Path(__file__).parent / "reference" / "paddle_ocr_reference.py"


@pytest.fixture(scope="module")
def manager(tiny_model, scorer_env_dir):
    """A reward manager whose one scorer is ``paddle_ocr`` on the tiny models; the scorer environment (and the
    models' builder, which runs in it) in the suite's cache."""
    patch = pytest.MonkeyPatch()
    patch.setenv(CACHE_ENV_VAR, str(scorer_env_dir))
    root = tiny_model("paddle_ocr")
    params = {
        "det_model_dir": f"{root}/det",
        "rec_model_dir": f"{root}/rec",
        "rec_char_dict_path": f"{root}/en_dict.txt",
    }
    config = OmegaConf.create({"reward": {"diffusion": {"scorers": [{"type": "paddle_ocr", "params": params}]}}})
    manager = DiffusionRewardManager(config)
    yield manager
    manager.reward.entries[0].scorer.close()
    patch.undo()


@pytest.fixture(scope="module")
def scorer(manager) -> PaddleOcrScorer:
    return manager.reward.entries[0].scorer


def _images() -> torch.Tensor:
    """Four noise images and a black one, uint8 [5, 3, 64, 128]."""
    generator = torch.Generator().manual_seed(0)
    noise = torch.randint(0, 256, (4, 3, 64, 128), dtype=torch.uint8, generator=generator)
    return torch.cat([noise, torch.zeros(1, 3, 64, 128, dtype=torch.uint8)])


def _reference(scorer, images: torch.Tensor, targets: list[str], tmp_path: Path) -> dict:
    request = {"root": str(Path(scorer.params.det_model_dir).parent), "images": str(tmp_path / "images.npy")}
    numpy.save(request["images"], images.permute(0, 2, 3, 1).numpy())
    (tmp_path / "request.json").write_text(json.dumps({**request, "targets": targets}))
    python = scorer.environment().python_executable()
    subprocess.run(
        [str(python), str(REFERENCE), str(tmp_path / "request.json"), str(tmp_path / "answer.json")],
        check=True,
        capture_output=True,
    )
    return json.loads((tmp_path / "answer.json").read_text())


@pytest.mark.slow
def test_scores_equal_paddleocrs_own_reading_through_the_published_formula(scorer, tmp_path):
    images = _images()
    reads = scorer.request(images, [""] * len(images))
    assert all(reads), f"the tiny models read something in every image: {reads}"
    one_off = reads[1][:-1] + ("b" if reads[1][-1] == "a" else "a")
    targets = [reads[0], one_off, reads[2][1:], "zz", reads[4].upper()]
    prompts = ["p0", f'a sign that reads "{one_off}"', "p2", "p3", "p4"]
    truths = [reads[0], None, reads[2][1:], "zz", reads[4].upper()]  # sample 1: the prompt's quoted span

    scores = scorer.score_sync(ScoreBatch(images, prompts, truths))
    reference = _reference(scorer, images, targets, tmp_path)

    assert reference["reads"] == reads
    assert scores == pytest.approx(reference["scores"], abs=1e-12)
    assert scores[0] == scores[2] == scores[4] == 1.0  # exact, contained, case
    assert 0.0 < scores[1] < 1.0
    assert scores[3] == 0.0  # no "z" in the tiny dictionary


@pytest.mark.slow
def test_the_score_reaches_the_reward_through_the_reward_manager(manager, scorer):
    """Targets from the ground truth (sample 0) and from the prompt's quoted text (sample 1, no ground truth)."""
    images = _images()[:2]
    reads = scorer.request(images, ["", ""])
    one_off = reads[1][:-1] + ("b" if reads[1][-1] == "a" else "a")
    data = DataProto.from_dict(
        tensors={"responses": images},
        non_tensors={
            "raw_prompt": numpy.array(["a sign", f'a sign that reads "{one_off}"'], dtype=object),
            "reward_model": numpy.array([{"ground_truth": reads[0].upper()}, {"ground_truth": None}], dtype=object),
        },
    )
    out = asyncio.run(manager.run_batch(data))
    expected = [1.0, 1.0 - 1.0 / len(one_off)]
    assert [o["reward_score"] for o in out] == pytest.approx(expected)
    assert [o["reward_extra_info"]["reward/paddle_ocr"] for o in out] == pytest.approx(expected)


@pytest.mark.slow
def test_the_environment_leaves_out_the_dependencies_it_overrides(scorer):
    """paddleocr declares the GUI OpenCVs (which need libGL) beside the headless one; the overrides drop them."""
    code = (
        "import importlib.metadata as m, cv2\n"
        "names = ('opencv-python', 'opencv-contrib-python', 'matplotlib', 'opencv-python-headless')\n"
        "print([n for n in names if any(d.metadata['Name'] == n for d in m.distributions())])"
    )
    python = str(scorer.environment().python_executable())
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['opencv-python-headless']"


def test_empty_params_are_refused_naming_the_key():
    with pytest.raises(ValueError, match="rec_model_dir must name a local path holding a PP-OCR text-recognition"):
        PaddleOcrParams(det_model_dir="d", rec_char_dict_path="x")


def test_a_missing_model_directory_names_the_key_and_the_released_model(tmp_path):
    (tmp_path / "rec").mkdir()
    (tmp_path / "dict.txt").write_text("a\n")
    params = {"det_model_dir": str(tmp_path / "det"), "rec_model_dir": str(tmp_path / "rec")}
    params["rec_char_dict_path"] = str(tmp_path / "dict.txt")
    with pytest.raises(FileNotFoundError, match=r"det_model_dir=.*det' is not a directory.*en_PP-OCRv3_det_infer.tar"):
        PaddleOcrScorer(PaddleOcrParams(**params))
    (tmp_path / "det").mkdir()
    for name in ("inference.pdmodel", "inference.pdiparams"):
        (tmp_path / "det" / name).write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"rec_model_dir=.* has no inference.pdmodel.*en_PP-OCRv4_rec_infer"):
        PaddleOcrScorer(PaddleOcrParams(**params))
    for name in ("inference.pdmodel", "inference.pdiparams"):
        (tmp_path / "rec" / name).write_bytes(b"")
    params["rec_char_dict_path"] = str(tmp_path / "missing.txt")
    with pytest.raises(FileNotFoundError, match=r"rec_char_dict_path=.*missing.txt' is not a file.*en_dict.txt"):
        PaddleOcrScorer(PaddleOcrParams(**params))

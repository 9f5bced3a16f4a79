"""Scorer registry: modeled on verl's register_trainer."""

from pathlib import Path

import pytest

from verl_omni.utils.reward_score import SCORERS, Scorer, available_scorers, get_scorer_cls, register_scorer

BUILT_IN = [
    "aesthetic",
    "brightness",
    "clip_score",
    "geneval",
    "geneval_server",
    "hpsv2",
    "hpsv3",
    "http",
    "http_video",
    "image_reward",
    "jpeg_compressibility",
    "jpeg_incompressibility",
    "ocr",
    "pickscore",
    "temporal_consistency",
    "videoalign",
    "vlm_judge",
]
DOC = Path(__file__).resolve().parents[3] / "docs" / "guide" / "rewards.md"


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_built_in_scorer_resolves_and_documents_its_range(name):
    cls = get_scorer_cls(name)
    assert issubclass(cls, Scorer)
    assert "Range" in cls.__doc__


def test_every_built_in_scorer_has_a_row_in_the_scorer_table_of_the_rewards_guide():
    rows = [line for line in DOC.read_text().splitlines() if line.startswith("| `")]
    listed = {line.split("`")[1] for line in rows}
    assert set(BUILT_IN) <= listed, sorted(set(BUILT_IN) - listed)
    assert set(BUILT_IN) <= set(available_scorers())


def test_unknown_scorer_lists_the_available_ones():
    with pytest.raises(ValueError, match="Unknown scorer 'nope'. Available: " + ", ".join(available_scorers())):
        get_scorer_cls("nope")


def test_register_rejects_duplicates_and_non_scorers():
    with pytest.raises(ValueError, match="scorer 'ocr' is already registered to .*OcrScorer"):

        @register_scorer("ocr")
        class Other(Scorer):
            async def score(self, batch):
                return []

    with pytest.raises(TypeError, match="cannot register .* as scorer 'not_a_scorer': wrong type"):
        register_scorer("not_a_scorer")(object)
    assert "not_a_scorer" not in SCORERS


def test_reregistering_the_same_class_is_a_no_op():
    cls = get_scorer_cls("jpeg_compressibility")
    assert register_scorer("jpeg_compressibility")(cls) is cls

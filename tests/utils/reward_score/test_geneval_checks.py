"""GenEval's check rules on hand-written detections; each expected value is worked out in the comment. The
scorers' params and the local scorer's refusal of a missing model directory (nothing starts)."""

import pytest

from verl_omni.utils.reward_score.geneval import (
    Detection,
    GenEvalChecks,
    GenEvalParams,
    GenEvalScorer,
    GenEvalServerParams,
    box_iou,
    check_metadata,
    evaluate_clauses,
    keep_detections,
    relative_position,
)

PARAMS = GenEvalChecks()


def det(x1, y1, x2, y2, score=0.95, color=None):
    return Detection((x1, y1, x2, y2), score, color)


def meta(**kw):
    return check_metadata({"tag": "single_object", **kw}, "test")


def test_box_iou_counts_pixels_inclusively():
    # 10x10 boxes (0..9) overlapping on columns 5..9: 50 / (100 + 100 - 50)
    assert box_iou((0, 0, 9, 9), (5, 0, 14, 9)) == pytest.approx(1 / 3)
    assert box_iou((0, 0, 9, 9), (20, 20, 29, 29)) == 0.0


def test_keep_detections_thresholds_sorts_and_caps():
    found = [det(0, 0, 1, 1, 0.4), det(0, 0, 1, 1, 0.9), det(0, 0, 1, 1, 0.3), det(0, 0, 1, 1, 0.6)]
    # 0.3 is not above the 0.3 threshold; the rest most confident first, capped at 2
    assert [d.score for d in keep_detections(found, 0.3, 2, 1.0)] == [0.9, 0.6]


def test_keep_detections_suppresses_overlaps_only_when_asked():
    found = [det(0, 0, 9, 9, 0.9), det(1, 0, 10, 9, 0.8), det(50, 50, 59, 59, 0.7)]
    # IoU of the first two = 90 / 110 = 0.82: removed at nms_iou 0.5, kept with NMS off (1.0)
    assert [d.score for d in keep_detections(found, 0.3, 16, 0.5)] == [0.9, 0.7]
    assert len(keep_detections(found, 0.3, 16, 1.0)) == 3


@pytest.mark.parametrize(
    "a, b, expected",
    [
        # centres 90 apart in x, sizes 20+20: shrunk -(90 - 4) / 90 = -0.96 -> left of
        ((0, 0, 20, 20), (90, 0, 110, 20), {"left of"}),
        ((90, 0, 110, 20), (0, 0, 20, 20), {"right of"}),
        # y grows downwards: a above b
        ((0, 0, 20, 20), (0, 90, 20, 110), {"above"}),
        # diagonal offset (50, 50), sizes 10+10: (48, 48) / 70.7 = 0.68 on both axes
        ((50, 50, 60, 60), (0, 0, 10, 10), {"right of", "below"}),
        # offset 3 < 0.1 * (20 + 20) = 4 on x, 0 on y: no relation
        ((3, 0, 23, 20), (0, 0, 20, 20), set()),
        # offset (40, 10), sizes 20+20: shrunk (36, 6) / 41.2 = (0.87, 0.15) -> only right of
        ((40, 10, 60, 30), (0, 0, 20, 20), {"right of"}),
    ],
)
def test_relative_position(a, b, expected):
    assert relative_position(a, b, 0.1) == expected


def test_include_needs_count_objects_above_threshold():
    m = meta(include=[{"class": "dog", "count": 2}])
    assert evaluate_clauses(m, {"dog": [det(0, 0, 5, 5, 0.95), det(9, 9, 15, 15, 0.5)]}, PARAMS) == [True]
    # the second dog scores 0.2 < 0.3
    assert evaluate_clauses(m, {"dog": [det(0, 0, 5, 5, 0.95), det(9, 9, 15, 15, 0.2)]}, PARAMS) == [False]
    assert evaluate_clauses(m, {"cat": [det(0, 0, 5, 5), det(9, 9, 15, 15)]}, PARAMS) == [False]


def test_counting_tag_uses_the_counting_threshold_and_exclude_caps_the_count():
    m = check_metadata(
        {"tag": "counting", "include": [{"class": "dog", "count": 2}], "exclude": [{"class": "dog", "count": 3}]},
        "t",
    )
    # 0.5 passes the 0.3 threshold but not the 0.9 counting one
    assert evaluate_clauses(m, {"dog": [det(0, 0, 5, 5, 0.95), det(9, 9, 15, 15, 0.5)]}, PARAMS) == [False, True]
    two = [det(0, 0, 5, 5, 0.95), det(9, 9, 15, 15, 0.92)]
    assert evaluate_clauses(m, {"dog": two}, PARAMS) == [True, True]
    # a third confident dog: the include still passes, the exclude (fewer than 3) fails
    assert evaluate_clauses(m, {"dog": two + [det(30, 30, 35, 35, 0.99)]}, PARAMS) == [True, False]


def test_color_is_checked_on_the_most_confident_objects_only():
    m = meta(include=[{"class": "car", "count": 1, "color": "red"}])
    top_blue = {"car": [det(0, 0, 5, 5, 0.95, "blue"), det(9, 9, 15, 15, 0.9, "red")]}
    top_red = {"car": [det(0, 0, 5, 5, 0.95, "red"), det(9, 9, 15, 15, 0.9, "blue")]}
    assert evaluate_clauses(m, top_blue, PARAMS) == [False]
    assert evaluate_clauses(m, top_red, PARAMS) == [True]


def test_position_refers_to_an_earlier_include_that_must_have_passed():
    m = meta(include=[{"class": "cat", "count": 1}, {"class": "dog", "count": 1, "position": ["left of", 0]}])
    cat, dog_left, dog_right = det(90, 0, 110, 20), det(0, 0, 20, 20), det(200, 0, 220, 20)
    assert evaluate_clauses(m, {"cat": [cat], "dog": [dog_left]}, PARAMS) == [True, True]
    assert evaluate_clauses(m, {"cat": [cat], "dog": [dog_right]}, PARAMS) == [True, False]
    # no cat: the target clause failed, so the position clause fails too
    assert evaluate_clauses(m, {"dog": [dog_left]}, PARAMS) == [False, False]


def test_position_must_hold_against_every_target_object():
    m = meta(include=[{"class": "cat", "count": 2}, {"class": "dog", "count": 1, "position": ["left of", 0]}])
    dog = det(100, 0, 120, 20)
    # the dog is right of the first cat, left of the second: not left of both
    cats = [det(0, 0, 20, 20, 0.95), det(300, 0, 320, 20, 0.94)]
    assert evaluate_clauses(m, {"cat": cats, "dog": [dog]}, PARAMS) == [True, False]


@pytest.mark.parametrize(
    "bad, match",
    [
        ("not json", "must be JSON"),
        ({"tag": "x"}, "needs 'include' and/or 'exclude'"),
        ({"include": [{"class": "dog"}]}, "needs a 'class' string and a 'count' >= 1"),
        ({"include": [{"class": "dog", "count": 1, "color": "teal"}]}, "color 'teal' is not one of"),
        ({"include": [{"class": "dog", "count": 1, "position": ["left of", 0]}]}, "index of an earlier include"),
        (
            {"include": [{"class": "a", "count": 1}, {"class": "b", "count": 1, "position": ["near", 0]}]},
            "needs one of",
        ),
    ],
)
def test_bad_metadata_names_the_sample(bad, match):
    with pytest.raises(ValueError, match=f"sample 3: .*{match}"):
        check_metadata(bad, "sample 3")


@pytest.mark.parametrize(
    "field, value", [("threshold", 1.5), ("nms_iou", 0.0), ("max_objects", 0), ("reward", "mean"), ("url", "ftp://x")]
)
def test_server_params_are_validated(field, value):
    with pytest.raises(ValueError, match=field):
        GenEvalServerParams(**{"url": "http://x", field: value})


@pytest.mark.parametrize("field", ["detector", "clip"])
def test_local_params_need_both_model_directories(field):
    with pytest.raises(ValueError, match=f"{field} must name a local directory"):
        GenEvalParams(**{"detector": "/d", "clip": "/c", field: ""})
    with pytest.raises(ValueError, match="threshold"):
        GenEvalParams(detector="/d", clip="/c", threshold=2.0)


def test_a_missing_detector_directory_is_named_before_the_child_starts(tmp_path):
    missing, clip = tmp_path / "no_detector", tmp_path / "clip"
    clip.mkdir()
    (clip / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=f"detector='{missing}' is not a directory; it must hold an object"):
        GenEvalScorer(GenEvalParams(detector=str(missing), clip=str(clip)))
    missing.mkdir()
    with pytest.raises(FileNotFoundError, match=f"detector='{missing}' has no config.json"):
        GenEvalScorer(GenEvalParams(detector=str(missing), clip=str(clip)))


def test_a_config_written_for_the_served_detector_is_told_to_use_geneval_server():
    from verl_omni.utils.reward_score.base import build_params

    with pytest.raises(ValueError, match=r"rewards\.0\.params: unknown parameter\(s\) \['url'\].*geneval_server"):
        build_params(GenEvalParams, {"url": "http://host:8090/detect"}, "rewards.0.params")

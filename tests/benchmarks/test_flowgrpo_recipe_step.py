"""The recipe benchmark's steady state: the median step after the compile steps, check steps apart.

The rows are the shape ``report`` makes from a run's ``metrics.jsonl``; the trainer itself needs a GPU for this
benchmark, so the rows are written here.
"""

import pytest
from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def recipe_step():
    return load_benchmark("flowgrpo_recipe_step")


def _row(step: int, step_s: float, old_log_prob_s: float | None = None) -> dict:
    row = {"step": step, "images": 64, "gpus": 1, "gen_s": 11.0, "step_s": step_s}
    if old_log_prob_s is not None:
        row["old_log_prob_s"] = old_log_prob_s
    return row


def test_the_median_leaves_out_the_compile_steps(recipe_step):
    rows = [_row(1, 220.0, 30.0), _row(2, 50.0, 20.0), _row(3, 46.0, 20.0), _row(4, 48.0, 20.0)]
    summary = recipe_step.steady_state(rows, warmup_steps=1)
    assert summary["steady_steps"] == 3 and summary["first_steady_step"] == 2
    assert summary["step_s"] == 48.0 and summary["img_per_gpu_s"] == round(64 / 48.0, 3)
    assert "check_steps" not in summary


def test_steps_that_ran_the_rollout_log_prob_check_are_summarised_apart(recipe_step):
    # π_old from the rollout, checked at step 4: steps 2 and 3 skip the old_log_prob phase
    rows = [_row(1, 221.0), _row(2, 45.0), _row(3, 46.8), _row(4, 79.2, 34.4)]
    summary = recipe_step.steady_state(rows, warmup_steps=1)
    assert summary["steady_steps"] == 2 and summary["step_s"] == 45.9
    assert "old_log_prob_s" not in summary
    assert summary["check_steps"] == [4] and summary["check_step_s"] == 79.2
    assert "img_per_gpu_s_with_checks" not in summary, "the check's period is unknown"
    # checked every 4th step: three steps of 45.9 s and one of 79.2 s
    summary = recipe_step.steady_state(rows, warmup_steps=1, check_freq=4)
    assert summary["img_per_gpu_s_with_checks"] == round(64 * 4 / (3 * 45.9 + 79.2), 3)


def test_the_check_period_is_read_from_the_overrides(recipe_step):
    key = "actor_rollout_ref.actor.rollout_log_prob_check_freq"
    assert recipe_step.check_freq(["trainer.total_training_steps=5", f"{key}=4"]) == 4
    assert recipe_step.check_freq(["actor_rollout_ref.actor.use_rollout_log_probs=true"]) == 0


def test_a_step_in_which_the_actor_compiled_again_is_left_out(recipe_step):
    # step 3's prompts had a new text length: the actor compiled 4 more graphs (model.compile_dynamic=false)
    rows = [_row(1, 330.0), _row(2, 140.0), _row(3, 190.0), _row(4, 142.0), _row(5, 138.0)]
    for row, graphs in zip(rows, (8, 8, 12, 12, 12), strict=True):
        row["perf/actor_compiled_graphs"] = graphs
    summary = recipe_step.steady_state(rows, warmup_steps=1)
    assert summary["recompiled_steps"] == [3]
    assert summary["steady_steps"] == 3 and summary["step_s"] == 140.0
    # a run without the count (an older trainer) keeps every step after the warm-up
    for row in rows:
        del row["perf/actor_compiled_graphs"]
    assert recipe_step.steady_state(rows, warmup_steps=1)["steady_steps"] == 4


def test_no_step_after_the_compile_steps(recipe_step):
    assert recipe_step.steady_state([_row(1, 220.0)], warmup_steps=2) == {"steady_steps": 0}

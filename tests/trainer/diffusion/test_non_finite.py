"""``trainer.nan_policy`` (``trainer/diffusion/non_finite.py``): which samples and metrics count as not finite and
what the error says."""

from __future__ import annotations

import math

import pytest
import torch

from verl_omni.trainer.config import FlowGRPOTrainerConfig
from verl_omni.trainer.diffusion import non_finite


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_the_rows_holding_a_nan_or_inf_are_named_by_index_and_prompt(bad):
    scores = torch.tensor([0.5, bad, 0.25, bad])
    rows = non_finite.bad_rows(scores)
    assert rows == [1, 3]
    text = non_finite.describe_rows("rm_scores", scores, ["u0", "u0", "u1", "u1"], rows, "the reward (brightness)")
    assert "sample(s) 1 (prompt u0" in text and "3 (prompt u1" in text and "the reward (brightness)" in text


def test_a_row_is_bad_when_any_of_its_values_is():
    values = torch.zeros(3, 2, 2)
    values[2, 1, 0] = math.nan
    assert non_finite.bad_rows(values) == [2]
    assert non_finite.bad_rows(torch.zeros(3, 2, 2)) == []


def test_more_than_eight_bad_samples_are_summarized():
    values = torch.full((20,), math.nan)
    text = non_finite.describe_rows("advantages", values, [f"u{i}" for i in range(20)], list(range(20)), "adv")
    assert "and 12 more" in text


def test_the_update_metrics_that_are_not_finite():
    metrics = {"actor/pg_loss": math.nan, "actor/grad_norm": 1.0, "critic/score/mean": math.nan}
    assert list(non_finite.bad_update_metrics(metrics)) == ["actor/pg_loss"]
    assert non_finite.bad_update_metrics({"actor/pg_loss": 0.1, "actor/grad_norm": 2.0}) == {}


def test_the_error_names_the_step_the_source_and_the_key():
    message = str(non_finite.error(7, "rm_scores of sample(s) 1 from the reward not finite"))
    assert message.startswith("step 7: rm_scores") and "trainer.nan_policy=skip_step" in message


def test_an_unknown_policy_is_refused_naming_the_key_and_the_choices():
    with pytest.raises(ValueError, match=r"trainer\.nan_policy must be one of \('stop', 'skip_step'\)"):
        FlowGRPOTrainerConfig(nan_policy="ignore")
    assert FlowGRPOTrainerConfig().nan_policy == "stop"

"""The generated scorer table (``docs/reference/scorers.md``) lists every built-in scorer as the registry has it."""

from dataclasses import dataclass

from verl_omni.trainer.config.scorer_table import COMMAND, PAGE, built_in_scorers, needs, render
from verl_omni.utils.reward_score import ThreadedScorer
from verl_omni.utils.reward_score.http_client import HttpParams
from verl_omni.utils.reward_score.temporal import TemporalParams


def test_scorer_table_page_is_in_sync_with_the_registry():
    assert PAGE.read_text() == render(), f"stale: run {COMMAND}"


def test_every_built_in_scorer_has_a_row():
    page = PAGE.read_text()
    for name in built_in_scorers():
        assert f"| `{name}` |" in page


def _scorer(params_cls):
    return type("Probe", (ThreadedScorer,), {"params_cls": params_cls, "score_sync": lambda self, batch: []})


@dataclass
class _RequiredWeights(TemporalParams):
    def __post_init__(self):
        if not self.model_path:
            raise ValueError("model_path is required")


def test_needs_tells_a_server_required_weights_optional_weights_and_nothing_apart():
    assert needs(_scorer(HttpParams)) == "server (`params.url`)"
    assert needs(_scorer(_RequiredWeights)) == "weights (`params.model_path`)"
    assert needs(_scorer(TemporalParams)) == "optional weights (`params.model_path`)"
    assert needs(ThreadedScorer) == "—"

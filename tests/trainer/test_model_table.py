"""The generated model capability matrix (``docs/reference/models.md``) says what the adapters say, and every test and
run it links exists."""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

import pytest

from verl_omni.pipelines.model_base import ModelAdapter
from verl_omni.pipelines.qwen_image.training_adapter import QwenImageTrainingAdapter
from verl_omni.pipelines.wan2_2.training_adapter import Wan22A14BTrainingAdapter
from verl_omni.trainer.config.model_evidence import GPU_SUITE, MODELS, REFUSAL_TESTS, EvidenceRun, EvidenceTest, Model
from verl_omni.trainer.config.model_table import (
    CAPABILITIES,
    COMMAND,
    PAGE,
    REPO,
    UNTESTED,
    adapter_rows,
    cell_evidence,
    check_evidence_map,
    render,
)

EVIDENCE = sorted(
    {*(e for m in MODELS.values() for e in m.evidence.values()), *REFUSAL_TESTS.values()},
    key=lambda e: (e.path, getattr(e, "name", ""), getattr(e, "param", "") or "", getattr(e, "heading", "")),
)
TESTS = [e for e in EVIDENCE if isinstance(e, EvidenceTest)]
RECORDS = [e for e in EVIDENCE if isinstance(e, EvidenceRun)]


def test_model_table_page_is_in_sync_with_the_adapters():
    assert PAGE.read_text() == render(), f"stale: run {COMMAND}"


def test_every_built_in_adapter_has_a_row_the_two_expert_wan_its_own():
    """Rows come from the registry, not from the evidence map: a model without evidence is listed too."""
    rows = adapter_rows()
    page = PAGE.read_text()
    for architecture, adapter in rows:
        label = MODELS[adapter.__name__].label if adapter.__name__ in MODELS else adapter.__name__
        assert f"| {label} (`{architecture}`" in page
    assert ("WanPipeline", Wan22A14BTrainingAdapter) in rows


@functools.cache
def _parsed(path: str) -> ast.Module:
    return ast.parse((REPO / path).read_text(), filename=path)


@pytest.mark.parametrize("test", TESTS, ids=lambda t: f"{Path(t.path).name}::{t.name}[{t.param or ''}]")
def test_every_linked_test_exists_with_its_parameter(test):
    """The file, the test function, and the parametrized id's part among the file's string constants (the model
    names its parameters are built from)."""
    assert (REPO / test.path).is_file(), test.path
    tree = _parsed(test.path)
    functions = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    assert test.name.startswith("test_") and test.name in functions, f"{test.path} has no {test.name}"
    if test.param:
        strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        assert test.param in strings, f"{test.path} names no parameter {test.param!r}"


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: f"{Path(r.path).name}: {r.heading[:40]}")
def test_every_linked_run_is_a_heading_of_its_page(record):
    headings = {
        line.lstrip("#").strip() for line in (REPO / record.path).read_text().splitlines() if line.startswith("#")
    }
    assert record.heading in headings


def _probe(name: str, base: type[ModelAdapter] = ModelAdapter, **facts) -> type[ModelAdapter]:
    # a test-module subclass: not a built-in adapter, so never a row of the page
    return type(name, (base,), {"__module__": __name__, **facts})


def _column(key: str):
    return next(c for c in CAPABILITIES if c.key == key)


def test_a_claim_the_adapter_contradicts_fails_the_generator_naming_model_and_capability():
    """Qwen-Image's split replay is evidenced as working; an adapter of that name that cannot split is an error."""
    cannot_split = _probe("QwenImageTrainingAdapter", QwenImageTrainingAdapter, supports_sequence_parallel=False)
    with pytest.raises(ValueError, match=r"QwenImageTrainingAdapter, 'sequence_parallel': the adapter says 'refused'"):
        cell_evidence(cannot_split, _column("sequence_parallel"))


def test_a_model_without_evidence_is_untested_where_allowed_and_refused_or_no_where_not():
    new = _probe("NewModelTrainingAdapter", rollout_weight_prefix=None, lora_file_pipeline="NewPipeline")
    verdicts = {c.key: cell_evidence(new, c) for c in CAPABILITIES}
    assert verdicts["rollout"] == (UNTESTED, None) and verdicts["lora_diffusers"] == (UNTESTED, None)
    assert verdicts["full_ft"] == ("refused", REFUSAL_TESTS["full_ft"])
    assert verdicts["sequence_parallel"] == ("refused", REFUSAL_TESTS["sequence_parallel"])
    assert verdicts["video"] == ("no", None) and verdicts["source_images"] == ("no", None)


@pytest.mark.slow
def test_every_linked_test_is_collected_under_the_id_the_page_prints():
    """pytest itself collects ``path::name[param]`` (``path::name`` for an unparametrized test): the page's ids are
    the ones ``pytest 'path::name[param]'`` runs. A fresh interpreter collects the linked files (nothing runs)."""
    files = sorted({t.path for t in TESTS})
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    collected = {line.strip() for line in proc.stdout.splitlines() if "::" in line}
    assert collected, proc.stdout[-2000:] + proc.stderr[-2000:]
    printed = {f"{t.path}::{t.name}" + (f"[{t.param}]" if t.param else "") for t in TESTS}
    assert sorted(printed - collected) == []


def test_evidence_for_a_removed_adapter_or_an_unknown_capability_fails_the_generator(monkeypatch):
    rows = adapter_rows()
    monkeypatch.setitem(MODELS, "GoneTrainingAdapter", Model("Gone"))
    with pytest.raises(ValueError, match="names GoneTrainingAdapter, which is no built-in model adapter"):
        check_evidence_map(rows)
    monkeypatch.delitem(MODELS, "GoneTrainingAdapter")
    typo = Model("Qwen-Image", {**MODELS["QwenImageTrainingAdapter"].evidence, "lora_serving": GPU_SUITE})
    monkeypatch.setitem(MODELS, "QwenImageTrainingAdapter", typo)
    with pytest.raises(ValueError, match=r"QwenImageTrainingAdapter: evidence for \['lora_serving'\], which are no"):
        check_evidence_map(rows)

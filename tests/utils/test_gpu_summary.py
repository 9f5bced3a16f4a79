"""``scripts/device/gpu_summary.py`` on the JUnit XML of a real pytest run: a generated test file with a pass that
prints figures (through ``tests/figures.py``, as the GPU tests do), a failure, a skip and a parametrized test, run
in a subprocess as ``run_gpu_tests.sh`` runs the suite."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"

GENERATED = f"""
import sys

import pytest

sys.path.insert(0, {str(TESTS)!r})
from figures import figure


@pytest.fixture(scope="module")
def measured():
    figure("setup_s", 12.345)
    return 3


def test_prints_figures(measured):
    print("a free-form line | with a pipe")
    figure("logprob_drift", 0.0042137)
    figure("buckets", measured)
    figure("card", "H100")


def test_fails():
    figure("before_failing", 1)
    assert 1 == 2, "one is not two"


@pytest.mark.skipif(True, reason="needs 2 GPUs")
def test_needs_two_gpus():
    pass


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_param(device):
    figure(f"{{device}}_ms", 1.5)
"""


def load_summary_module():
    spec = importlib.util.spec_from_file_location("gpu_summary", REPO / "scripts" / "device" / "gpu_summary.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def junit_xml(tmp_path_factory) -> Path:
    """The XML of pytest run on the generated file with the options run_gpu_tests.sh passes."""
    root = tmp_path_factory.mktemp("gpu_summary")
    (root / "test_generated.py").write_text(GENERATED)
    xml = root / "results.xml"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "test_generated.py",
            "-p",
            "no:cacheprovider",
            "-o",
            "junit_logging=system-out",
        ]
        + [f"--junitxml={xml}", "--rootdir", str(root), "-c", "/dev/null", "-p", "no:xdist"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]  # the one failure
    return xml


@pytest.mark.slow  # the XML comes from pytest run in a fresh interpreter
def test_each_test_is_a_row_with_its_result_and_figures(junit_xml):
    gpu_summary = load_summary_module()
    results = {r.name.split("::")[-1]: r for r in gpu_summary.read_junit(str(junit_xml))}
    assert set(results) == {
        "test_prints_figures",
        "test_fails",
        "test_needs_two_gpus",
        "test_param[cpu]",
        "test_param[cuda]",
    }
    passed = results["test_prints_figures"]
    assert passed.result == "passed" and passed.seconds >= 0
    # the module fixture's figure is in the output of the first test that used it
    assert passed.figures == {"setup_s": "12.3", "logprob_drift": "0.00421", "buckets": "3", "card": "H100"}
    assert results["test_fails"].result == "failed" and "one is not two" in results["test_fails"].reason
    assert results["test_fails"].figures == {"before_failing": "1"}
    assert (
        results["test_needs_two_gpus"].result == "skipped" and "needs 2 GPUs" in results["test_needs_two_gpus"].reason
    )
    assert results["test_param[cuda]"].figures == {"cuda_ms": "1.5"}


@pytest.mark.slow  # pytest in a fresh interpreter, then the script in another
def test_the_page_has_a_header_the_counts_and_one_table_row_per_test(junit_xml):
    out = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "device" / "gpu_summary.py"),
            str(junit_xml),
            "--header",
            "# GPU suite",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "# GPU suite"
    assert lines[2].startswith("3 passed, 1 failed, 1 skipped; ")
    rows = [line for line in lines if line.startswith("| `")]
    assert len(rows) == 5
    row = next(r for r in rows if "test_prints_figures" in r)
    assert row.count(" | ") == 3, "a figure or a printed pipe must not add a column"
    assert "| passed |" in row and "logprob_drift=0.00421; buckets=3; card=H100" in row
    assert "a free-form line" not in out.stdout, "only figure lines reach the table"
    assert "needs 2 GPUs" in next(r for r in rows if "test_needs_two_gpus" in r)


def test_a_figure_name_with_a_space_is_refused():
    sys.path.insert(0, str(TESTS))
    from figures import figure

    with pytest.raises(ValueError, match="no spaces"):
        figure("log prob", 1.0)

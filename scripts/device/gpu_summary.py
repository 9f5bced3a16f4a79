"""The one-page summary of a GPU suite run: a markdown table made from pytest's JUnit XML.

``run_gpu_tests.sh`` runs pytest with ``--junitxml`` and ``-o junit_logging=system-out``, so each test's
captured output is in the XML beside its result and duration. This module turns that file into one row per
test (result, seconds, the figures it printed: lines ``[figure] name=value``, ``tests/figures.py``), with the
reason of every skip or failure's first line, under a header the caller passes (cards, commit). The docs'
GPU results table is pasted from this output, never typed.

Usage: ``python scripts/device/gpu_summary.py JUNIT_XML [--header LINE]... > summary.md``
"""

from __future__ import annotations

import argparse
import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

# a figure line as tests/figures.py prints it
FIGURE_LINE = re.compile(r"^\[figure\] (?P<name>[^\s=]+)=(?P<value>.*\S)\s*$", re.MULTILINE)
# the longest reason kept in a row (a traceback's first line can be long)
REASON_CHARS = 160


@dataclass(frozen=True)
class TestResult:
    """One ``<testcase>`` of the XML."""

    name: str
    result: str
    seconds: float
    figures: dict[str, str] = field(default_factory=dict)
    reason: str = ""


def figures_of(output: str) -> dict[str, str]:
    """The ``[figure] name=value`` lines of a test's output, in order (a name printed twice keeps its last value)."""
    return {m["name"]: m["value"] for m in FIGURE_LINE.finditer(output)}


def _first_line(text: str | None) -> str:
    line = next((line.strip() for line in (text or "").splitlines() if line.strip()), "")
    return line if len(line) <= REASON_CHARS else line[: REASON_CHARS - 3] + "..."


def read_junit(path: str) -> list[TestResult]:
    """Every test case of a JUnit XML file written by pytest, in file order."""
    root = ET.parse(path).getroot()
    results = []
    for case in root.iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        output = "\n".join(node.text or "" for node in case.findall("system-out"))
        result, reason = "passed", ""
        for tag, label in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            node = case.find(tag)
            if node is not None:
                result = label
                reason = _first_line(node.get("message")) or _first_line(node.text)
                break
        results.append(
            TestResult(
                name=f"{classname}::{name}" if classname else name,
                result=result,
                seconds=float(case.get("time") or 0.0),
                figures=figures_of(output),
                reason=reason,
            )
        )
    return results


def _cell(text: str) -> str:
    """Text safe inside a markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def summary(results: list[TestResult], header: list[str] = ()) -> str:
    """The markdown page: the header lines, the counts, and one table row per test."""
    counts = {label: sum(r.result == label for r in results) for label in ("passed", "failed", "error", "skipped")}
    total = sum(r.seconds for r in results)
    lines = [*header, ""] if header else []
    lines.append(", ".join(f"{n} {label}" for label, n in counts.items() if n) + f"; {total:.0f} s in tests")
    lines += ["", "| test | result | s | figures |", "|---|---|---:|---|"]
    for r in results:
        shown = "; ".join(f"{k}={v}" for k, v in r.figures.items())
        if r.reason:
            shown = f"{shown}; {r.reason}" if shown else r.reason
        lines.append(f"| `{_cell(r.name)}` | {r.result} | {r.seconds:.1f} | {_cell(shown)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit_xml", help="pytest's --junitxml file (run with -o junit_logging=system-out)")
    parser.add_argument("--header", action="append", default=[], help="a line above the table (repeatable)")
    args = parser.parse_args(argv)
    sys.stdout.write(summary(read_junit(args.junit_xml), args.header))
    return 0


if __name__ == "__main__":
    sys.exit(main())

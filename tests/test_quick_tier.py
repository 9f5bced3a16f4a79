"""The quick tier (``-m "not slow and not gpu"``) stays quick: a test whose fixtures start processes carries ``slow``.

A developer runs the quick tier after each change; one engine start, Ray cluster or fresh interpreter costs
seconds to minutes on a laptop's cores, so a test that needs one belongs to the full suite (CPU CI runs both).
The check reads the fixtures each collected test uses, so it covers what the session selected: in the quick
tier, a newly added test that slipped in unmarked fails here.
"""

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# fixtures of tests/conftest.py and its siblings whose set-up starts processes or a cluster
PROCESS_FIXTURES = frozenset(
    {
        # a vLLM-Omni engine and its worker processes
        "engine",
        "own_engine",
        "bf16_engine",
        "bagel_engine",
        "thinker_dit_engine",
        # the session's Ray cluster (two nodes)
        "ray_cluster",
        "ray_connect",
        "ray_driver",
        # a torch.distributed group
        "process_group",
        "cuda_process_group",
        "device_process_group",
        # a new interpreter importing the stack
        "fresh_python",
    }
)


def _unmarked_process_users(items) -> list[str]:
    """Collected CPU tests (not ``gpu``) that use a process fixture without the ``slow`` mark."""
    return [
        item.nodeid
        for item in items
        if PROCESS_FIXTURES & set(getattr(item, "fixturenames", ()))
        and item.get_closest_marker("slow") is None
        and item.get_closest_marker("gpu") is None
    ]


def test_every_test_that_starts_processes_is_marked_slow(request):
    offenders = _unmarked_process_users(request.session.items)
    assert not offenders, (
        "these tests start an engine, a Ray cluster, a process group or an interpreter through their fixtures "
        f"({sorted(PROCESS_FIXTURES)}) but are not marked slow; add @pytest.mark.slow (or the module's "
        f"pytestmark) so the quick tier stays quick: {offenders}"
    )


def test_the_process_fixtures_are_the_conftests_fixtures():
    """A renamed fixture would silently leave the check above; every listed name is still a conftest fixture."""
    fixture = re.compile(r"^@pytest\.fixture\b[^\n]*\n(?:@[^\n]*\n)*def (\w+)\(", re.M)
    defined = {name for conftest in TESTS.rglob("conftest.py") for name in fixture.findall(conftest.read_text())}
    assert PROCESS_FIXTURES <= defined, f"not a fixture of any conftest.py: {sorted(PROCESS_FIXTURES - defined)}"

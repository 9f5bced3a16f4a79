"""The figure line a test prints for the GPU suite's summary (``scripts/device/gpu_summary.py`` collects them).

A figure is one number a test measured and a reader wants to see beside its result: a log-prob drift,
a time, a sync's bucket count. Printed as ``[figure] name=value`` on a line of its own, it reaches the
JUnit XML with the test's captured output and becomes a cell of the summary's table; free-form prints
stay in the log only. Names are short and without spaces or ``=`` (the summary's cell reads
``name=value``).
"""

from __future__ import annotations

# what starts a figure line; gpu_summary.py reads the same
PREFIX = "[figure]"


def figure(name: str, value, fmt: str = ".3g") -> None:
    """Print ``[figure] name=value`` (``value`` formatted with ``fmt`` when it is a number)."""
    if not name or any(c.isspace() or c == "=" for c in name):
        raise ValueError(f"a figure's name has no spaces or '=': {name!r}")
    text = format(value, fmt) if isinstance(value, int | float) and not isinstance(value, bool) else str(value)
    print(f"{PREFIX} {name}={text}", flush=True)

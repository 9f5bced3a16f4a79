"""A call run beside the caller in a daemon thread, its outcome as a ``Future``.

``ThreadPoolExecutor`` joins its threads when its ``with`` block ends and again when the interpreter exits, so a
call stuck for good (a worker start waiting on a placement group that never comes) would keep the driver from
raising the error that stopped it (the progress watchdog's) and from exiting. A daemon thread is joined by
neither: the caller waits on the ``Future`` only while it wants the result.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


def run_beside(call: Callable[[], Any], name: str) -> Future:
    """Start ``call()`` in a daemon thread named ``name``; the ``Future`` holds its return value or its exception."""
    future: Future = Future()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(call())
        except BaseException as error:
            future.set_exception(error)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future

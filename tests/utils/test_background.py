"""``run_beside``: a call's outcome comes back through the future, and a call stuck for good holds nothing up."""

import threading

import pytest

from verl_omni.utils.background import run_beside


def test_the_result_and_the_error_come_back_through_the_future():
    assert run_beside(lambda: 42, "answer").result(timeout=60) == 42

    def fail():
        raise ValueError("no placement group")

    with pytest.raises(ValueError, match="no placement group"):
        run_beside(fail, "failing").result(timeout=60)


@pytest.mark.slow  # a fresh interpreter
def test_a_call_stuck_for_good_neither_blocks_the_caller_nor_the_interpreters_exit(fresh_python):
    stuck = run_beside(threading.Event().wait, "stuck")
    assert not stuck.done()
    # the same in a new interpreter that then exits: a pool's thread would be joined there and never end
    code = (
        "import threading\n"
        "from verl_omni.utils.background import run_beside\n"
        "run_beside(threading.Event().wait, 'stuck')\n"
        "print('exiting')\n"
    )
    assert fresh_python(code, timeout=120).strip() == "exiting"

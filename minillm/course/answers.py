"""minillm's answer to an exercise, shown in the notebook only once the learner's own passes.

A learner who runs every cell of a chapter top to bottom would otherwise read the answer before
trying: each chapter's answer cell calls ``show_answer`` with the report of its ``check()`` cell,
and the source appears only when that check passed every test -- or when the learner says they
would rather see it now (``give_up=True``).
"""

from __future__ import annotations

import inspect


def show_answer(report, *objects, give_up: bool = False) -> bool:
    """Print the source of ``objects`` when ``report`` (a ``check()`` result) passed every test or
    ``give_up`` is set; else say what is missing. Returns whether the answer was shown."""
    passed = bool(report is not None and report.total and report.passed == report.total)
    if not (passed or give_up):
        so_far = f"{report.passed} of {report.total} tests pass" if report is not None else "no check has run yet"
        print(
            f"minillm's answer appears here once your check passes every test ({so_far}): run the check cell "
            "again after your next save. To see it now instead, set GIVE_UP = True in this cell (give_up=True)."
        )
        return False
    if not passed:
        print("(shown before your check passed, as you asked)\n")
    for obj in objects:
        print(inspect.getsource(obj))
    return True

"""``check("ch01")``: grade your exercises from inside a notebook.

The tests run in a fresh Python process, exactly as ``minillm grade`` runs them, so they import
the code you saved in ``exercises/`` just now, not whatever this kernel imported earlier.
"""

from __future__ import annotations

from minillm.course.grading import DEFAULT_TIMEOUT, Report, grade


def check(chapter: str, timeout: float = DEFAULT_TIMEOUT) -> Report:
    """Run ``chapter``'s grading tests on your exercises; print a ✓/✗ line per test (with a hint
    for each failure) and return the ``Report`` (``.passed``, ``.total``, ``.score``, ``.results``)."""
    report = grade([chapter], impl="exercises", timeout=timeout)
    print(report.table())
    return report

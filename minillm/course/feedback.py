"""``check("ch01")``: grade your exercises from inside a notebook.

The tests run in fresh processes, exactly as ``minillm grade`` runs them, so they import the code
you saved in ``exercises/`` just now, not whatever this kernel imported earlier, and code that
hangs costs a test its time limit, not your kernel. What your code prints is kept only in part (the
last characters of each test's output, in ``report.results[i].output``).
"""

from __future__ import annotations

from minillm.course.grading import DEFAULT_TIMEOUT, Report, grade


def check(
    chapter: str, timeout: float = DEFAULT_TIMEOUT, chapter_timeout: float | None = None, hint: int = 1
) -> Report:
    """Run ``chapter``'s grading tests on your exercises; print a ✓/✗ line per test (with a hint
    for each failure) and return the ``Report`` (``.passed``, ``.total``, ``.points``, ``.results``).
    A failure's hint is a ladder: ``hint=1`` names the mistake the test caught, ``hint=2`` and up say
    more, the last gives the idea. ``timeout`` limits each call into your code, ``chapter_timeout``
    the whole chapter (default 10x)."""
    if isinstance(hint, bool) or not isinstance(hint, int) or hint < 1:
        raise ValueError(f"hint must be a whole number >= 1 (the rung of each hint ladder), got {hint!r}")
    report = grade([chapter], impl="exercises", timeout=timeout, chapter_timeout=chapter_timeout)
    print(report.table(hint))
    return report

"""The pytest plugin behind ``minillm grade``: it records one line of JSON per test event.

The grader runs pytest in a subprocess with ``-p minillm.course.pytest_plugin`` and the path of a
results file in ``MINILLM_GRADE_REPORT``. Lines are appended as tests finish, not written at the end,
so a run that dies half way (learner code that crashes the interpreter) still leaves every result
it reached, and the collected-but-unfinished tests show which test it died in.
"""

from __future__ import annotations

import json
import os

import pytest

REPORT_ENV = "MINILLM_GRADE_REPORT"
TIMEOUT_PREFIX = "Timeout (>"  # how pytest-timeout's failure message starts


def pytest_configure(config):
    # Also registered in pyproject.toml; repeated here for test folders outside this repository.
    config.addinivalue_line("markers", "hint(text): the hint the grader prints when this grading test fails")


def pytest_collection_finish(session):
    for item in session.items:
        _write({"nodeid": item.nodeid, "status": None, "hint": _hint(item)})


def pytest_collectreport(report):
    if report.failed:  # e.g. a syntax error in a test file: no test of it can run
        errors = [line[1:].strip() for line in str(report.longrepr).splitlines() if line.startswith("E ")]
        _write({"nodeid": report.nodeid, "status": "failed", "message": _first_line(errors[-1] if errors else str(report.longrepr))})


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if call.when == "call" or not report.passed:  # setup and teardown matter only when they fail or skip
        _write({"nodeid": item.nodeid, "status": _status(report, call), "message": _message(report, call), "hint": _hint(item)})
    return report


def _status(report, call) -> str:
    if report.skipped:
        return "skipped"
    if report.passed:
        return "passed"
    exc = call.excinfo
    if exc is not None and exc.errisinstance(NotImplementedError):
        return "not_implemented"
    if exc is not None and exc.errisinstance(pytest.fail.Exception) and str(exc.value).startswith(TIMEOUT_PREFIX):
        return "timeout"
    return "failed"


def _message(report, call) -> str:
    if call.excinfo is None:
        return ""
    error = call.excinfo.value
    if report.skipped:
        return str(getattr(error, "msg", error))
    text = str(error)  # for a SyntaxError this names the file and line; for an assert, pytest's explanation
    return _first_line(f"{type(error).__name__}: {text}" if text else type(error).__name__)


def _first_line(text: str, limit: int = 300) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _hint(item) -> str:
    marker = item.get_closest_marker("hint")
    return marker.args[0] if marker and marker.args else ""


def _write(entry: dict) -> None:
    with open(os.environ[REPORT_ENV], "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")
